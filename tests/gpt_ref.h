/* tests/gpt_ref.h — examples/train_gpt's model in double precision, written
 * from its definition (issue text and docs/TUTORIAL.md), independent of the
 * library: the forward, the mean cross-entropy, every gradient by hand, and
 * AdamW with global-norm clipping. It reads a run's --dump files (config.txt,
 * params.txt, init.bin, tokens.bin) and replays the steps.
 */
#ifndef DT_TEST_GPT_REF_H
#define DT_TEST_GPT_REF_H

#include <stddef.h>
#include <stdint.h>

typedef struct gpt_ref {
    int64_t vocab, layers, dim, heads, kv_heads, ffn, seq, batch, steps;
    double lr, beta1, beta2, eps, weight_decay, clip, rope_base, norm_eps;
    /* config.txt's optional `packed 1` and separator.bin: a document ends
     * after each separator (and at the sequence's end); attention stays in
     * a document and rotary positions count from its first token */
    int packed;
    unsigned char sep[64];
    int sep_len;
    int np;                       /* parameters, in params.txt's order */
    char (*name)[64];
    int *ndim;
    int64_t (*shape)[2];
    int64_t *offset, total;       /* each parameter's first value in w */
    double *w, *grad, *m, *v;     /* [total] */
} gpt_ref;

/* Reads dir/config.txt (and separator.bin when packed), params.txt and
 * init.bin: 0 on success, else -1 with a message on stderr. */
int gpt_ref_load(gpt_ref *r, const char *dir);
void gpt_ref_free(gpt_ref *r);

/* The mean loss of one batch tokens [batch][seq + 1] at the current
 * parameters, and every gradient into r->grad. */
double gpt_ref_loss_grad(gpt_ref *r, const int32_t *tokens);

/* The loss alone (for finite differences). */
double gpt_ref_loss(gpt_ref *r, const int32_t *tokens);

/* One step: loss and gradients, global-norm clipping, AdamW (step from 1);
 * returns the loss and *norm the gradient norm before clipping. lr: this
 * step's learning rate. */
double gpt_ref_step(gpt_ref *r, const int32_t *tokens, int64_t step, double lr, double *norm);

#endif /* DT_TEST_GPT_REF_H */
