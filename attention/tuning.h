/* attention/tuning.h — how the CUDA attention kernels are chosen and
 * launched (dt_attention_options.tuning). Speed only: results never depend
 * on any of it. The CPU backend ignores it. */
#ifndef DT_ATTN_TUNING_H
#define DT_ATTN_TUNING_H

#ifdef __cplusplus
extern "C" {
#endif

/* Which CUDA kernel runs a block, forward and backward alike. Each kernel
 * has two forms: VERIFIED (has passed the CUDA suites and compute-sanitizer
 * on a GPU) and LATEST (changes no GPU has run yet; tested on the CPU
 * emulator). Only the LATEST forms keep NaN and Inf inputs exactly
 * (docs/RELIABILITY.md, "Non-finite values never vanish"); a call on
 * VERIFIED ones with a non-finite input gets NaN in every output.
 * docs/PERFORMANCE.md says which ran where.
 * Grouped launches (dt_attention_options.group > 1) are verified on no GPU
 * in any form. */
typedef enum dt_attn_kernel_choice {
    DT_ATTN_KERNEL_AUTO = 0,     /* the fastest path verified on this GPU's architecture
                                    that can run the block, else the simple kernel */
    DT_ATTN_KERNEL_SIMPLE,       /* always the simple kernel */
    DT_ATTN_KERNEL_MMA,          /* the sm_80 tensor-core kernel, VERIFIED form, or
                                    DT_ERR_NOT_SUPPORTED */
    DT_ATTN_KERNEL_WGMMA,        /* the Hopper wgmma kernel, VERIFIED form, or
                                    DT_ERR_NOT_SUPPORTED */
    DT_ATTN_KERNEL_MMA_LATEST,   /* the mma kernel, LATEST form, or DT_ERR_NOT_SUPPORTED */
    DT_ATTN_KERNEL_WGMMA_LATEST, /* the wgmma kernel, LATEST form, or DT_ERR_NOT_SUPPORTED */
    DT_ATTN_KERNEL_SIMPLE_LATEST, /* always the simple kernel, LATEST form */
    DT_ATTN_KERNEL_COUNT
} dt_attn_kernel_choice;

/* "auto", "simple", "mma", "wgmma", "mma-latest", "wgmma-latest",
 * "simple-latest"; "unknown" otherwise. */
const char *dt_attn_kernel_choice_name(dt_attn_kernel_choice k);

typedef struct dt_attention_tuning {
    dt_attn_kernel_choice kernel; /* AUTO: the DT_ATTN_KERNEL environment variable, else auto */
    int persistent;       /* wgmma forward: 1 persistent CTAs except beside a ring transfer,
                             2 always, 0 a CTA per query tile */
    int dependent_launch; /* compute capability 9.0: 1 a call's later blocks start as programmatic
                             dependents, 2 and wait per 16 query rows, 0 after the one before */
    int producer;         /* wgmma forward at D = 128: 1 a producer warpgroup loads, 0 thread 0 */
} dt_attention_tuning;

#define DT_ATTENTION_TUNING_INIT { DT_ATTN_KERNEL_AUTO, 1, 1, 1 }

#ifdef __cplusplus
}
#endif
#endif /* DT_ATTN_TUNING_H */
