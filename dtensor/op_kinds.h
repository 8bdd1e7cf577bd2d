/* dtensor/op_kinds.h — the enums that pick an op's variant (ops.h,
 * ops_nn.h), which the compute backends take as well. */
#ifndef DT_OP_KINDS_H
#define DT_OP_KINDS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_gelu_approx {
    DT_GELU_ERF = 0,     /* x/2 * (1 + erf(x / sqrt 2)) */
    DT_GELU_TANH,        /* x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    DT_GELU_APPROX_COUNT
} dt_gelu_approx;

/* Names for messages ("erf", "tanh"; "half", "interleaved"); "unknown" otherwise. */
const char *dt_gelu_approx_name(dt_gelu_approx approx);

typedef enum dt_rotary_style {
    DT_ROTARY_HALF = 0,       /* rotate pairs (i, i + D/2): GPT-NeoX, Llama */
    DT_ROTARY_INTERLEAVED,    /* rotate pairs (2i, 2i + 1): RoFormer, GPT-J */
    DT_ROTARY_STYLE_COUNT
} dt_rotary_style;

const char *dt_rotary_style_name(dt_rotary_style style);

#ifdef __cplusplus
}
#endif
#endif /* DT_OP_KINDS_H */
