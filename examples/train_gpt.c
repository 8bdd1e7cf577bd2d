/* examples/train_gpt.c — trains a Llama-style decoder with data, tensor and
 * context parallelism (dp x tp x cp), from the library's public calls.
 *
 * The model (docs/TUTORIAL.md builds it step by step), with y = x @ W:
 *   h = tok_emb[x]; per layer:
 *     a = rmsnorm(h, attn_norm); q, k, v = a @ wq, a @ wk, a @ wv as
 *     [B, S, H|Hkv, Dh]; rotary (half) on q, k at each token's position;
 *     causal GQA attention, scale 1/sqrt(Dh); h = h + o @ wo
 *     m = rmsnorm(h, mlp_norm); h = h + (silu(m @ w_gate) * (m @ w_up)) @ w_down
 *   logits = rmsnorm(h, norm) @ lm_head; loss = mean cross-entropy
 * AdamW (PyTorch's), gradients clipped by their global norm.
 *
 * Placement per axis (the mesh's dims are (dp, cp, tp): tp fastest):
 *   tokens, targets [B, S]   Shard(0)      Replicate       Shard(1, order)
 *   h, a, m [B, S, d]        Shard(0)      Replicate       Shard(1, order)
 *                                          (--sp: Shard(1) too: cp's part, in
 *                                           its order, cut in tp's contiguous
 *                                           blocks; all-gathered over tp before
 *                                           the column-parallel matmuls)
 *   q, k, v, o [B,S,H,Dh]    Shard(0)      Shard(2) heads  Shard(1, order)
 *   wq, wk, wv, w_gate, w_up Replicate     Shard(1)        Replicate  column-parallel
 *   wo, w_down               Replicate     Shard(0)        Replicate  row-parallel: out Partial
 *   tok_emb [V, d]           Replicate     Shard(0)        Replicate  vocab-parallel
 *   lm_head [d, V]           Replicate     Shard(1)        Replicate  vocab-parallel loss
 *   norms [d]                Replicate everywhere
 * The rules of the ops (ops.h) give every gradient's Layout; a weight's
 * gradient is Partial over dp and cp (and tp for the norms under --sp) and
 * is reduced once per step (dt_tensor_grad_reduce) before AdamW.
 *
 * Runs as threads (--ranks N, default dp*tp*cp) or as processes under
 * mpirun or srun with the same flags. Exit status: 0 trained, 1 a library
 * error, 2 bad flags or a mesh that does not divide the model.
 *
 * Run: build/examples/train_gpt --help
 * Test: tests/test_train.c (make test).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "attention/attention.h"
#include "dtensor/dtensor.h"

#define NAME "train_gpt"
#include "examples/example_util.h"

#define VOCAB 256
#define MAX_LAYERS 64
#define PER_LAYER 9
#define MAX_PARAMS (MAX_LAYERS * PER_LAYER + 3)
#define ROPE_BASE 10000.0f
#define NORM_EPS 1e-5f

/* ------------------------------------------------------------------ config */

typedef struct config {
    int ranks, dp, tp, cp, sp, recompute, profile, comm_counts;
    int packed;                /* documents end after each separator (sep_len bytes) */
    char sep[64];
    int sep_len;
    dt_order order;
    int64_t layers, dim, heads, kv_heads, ffn, seq, batch, steps, warmup, save_every, log_every;
    int64_t sample_chars;
    float lr, min_lr, clip, weight_decay, beta1, beta2, eps;
    int cosine;
    double peak_tflops;
    uint64_t seed;
    dt_dtype dtype;
    dt_backend_kind backend;
    const char *data, *dump, *save, *resume, *export_path, *svg, *prompt;
} config;

static void usage(FILE *f) {
    fprintf(f,
        "usage: " NAME " [flags]\n"
        "  --ranks N          ranks (default dp*tp*cp): threads, or processes under mpirun/srun\n"
        "  --dp A --tp B --cp C  the mesh (A*B*C = N; default 1 each)\n"
        "  --order contiguous|striped|zigzag   the sequence's sharding over cp (default striped)\n"
        "  --sp               sequence parallelism inside tp (with cp: the sequence over both)\n"
        "  --layers L --dim d --heads H --kv-heads Hkv --ffn F   the model (2 64 4 H/2 4d rounded)\n"
        "  --seq S --batch B  tokens per sequence and sequences per step (64 8)\n"
        "  --steps N          the total steps, counted from the start of training (100)\n"
        "  --lr X --warmup N --cosine --min-lr X   learning rate (3e-3, constant unless warmup or\n"
        "                     --cosine: linear warmup, then cosine decay to min-lr, 0.1 lr)\n"
        "  --clip X --weight-decay X   global-norm clipping (1.0) and AdamW's decay (0.1)\n"
        "  --seed N           parameters and data positions (1)\n"
        "  --dtype fp32|bf16|fp16  parameters and activations (fp32 master weights otherwise)\n"
        "  --backend auto|cpu|cuda\n"
        "  --data FILE        bytes to train on (default examples/data/tinyshakespeare.txt,\n"
        "                     from the working directory or the source tree of this binary)\n"
        "  --recompute        keep only each layer's input; recompute the rest in the backward\n"
        "  --packed           each sequence packs documents, which end after each separator:\n"
        "                     attention stays inside a document, rotary positions restart\n"
        "  --separator TEXT   the documents' separator (default \"\\n\\n\", a blank line; the\n"
        "                     escapes \\n \\t \\\\ are read)\n"
        "  --dump DIR         config.txt params.txt init.bin final.bin tokens.bin loss.txt\n"
        "                     (and separator.bin with --packed)\n"
        "                     (and grad0.bin: the first step's gradients, as init.bin)\n"
        "  --save DIR --save-every N   checkpoints (each rank's shards and a manifest)\n"
        "  --resume DIR       continue a checkpoint, on this mesh or another (the model's\n"
        "                     flags and --seed not given are the checkpoint's)\n"
        "  --export FILE      the unsharded parameters in the safetensors format\n"
        "  --svg FILE         the loss curve\n"
        "  --log-every N      a line every N steps (default: about 50 lines a run)\n"
        "  --sample N         characters sampled greedily at the end (200; 0: none)\n"
        "  --prompt TEXT      the sample's start (default the corpus's first line)\n"
        "  --peak-tflops X    the peak for MFU (default: measured with a matmul at the start)\n"
        "  --profile          at the end (it steps the parameters further), each rank times a\n"
        "                     step, its matmuls alone and its attention calls alone (medians)\n"
        "  --comm-counts      rank 0 prints what it moved in the first step (forward, backward,\n"
        "                     optimizer; with --dump, grad0.bin's gathering too), a line per\n"
        "                     communicator and kind used: comm dp|tp|cp|world KIND calls N sent\n"
        "                     BYTES recv BYTES (bytes as collectives/comm.h counts them)\n");
}

static int parse_float(const char *flag, const char *v, double lo, double hi, float *out) {
    char *end = NULL;
    errno = 0;
    const double x = v ? strtod(v, &end) : NAN;
    if (!v || !*v || *end || errno || !(x >= lo && x <= hi)) {
        fprintf(stderr, NAME ": %s takes a number in [%g, %g], got '%s'\n", flag, lo, hi,
                v ? v : "(nothing)");
        return 0;
    }
    *out = (float)x;
    return 1;
}

/* --resume without the model's flags or --seed: the checkpoint's (layers,
 * dim, heads, kv_heads, ffn, dtype, seed) for each flag not given; an
 * unreadable manifest is left to checkpoint_load to report. */
enum { GIVEN_LAYERS = 1, GIVEN_DIM = 2, GIVEN_HEADS = 4, GIVEN_KV = 8, GIVEN_FFN = 16, GIVEN_DTYPE = 32,
       GIVEN_SEED = 64, GIVEN_SEPARATOR = 128 };
static void resume_model(config *c, unsigned given) {
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.txt", c->resume);
    FILE *f = fopen(path, "r");
    if (!f) return;
    int version = 0, mesh[3], sp, vocab;
    long long s, L, d, H, Hkv, F;
    unsigned long long seed;
    char dtype[16];
    const int ok = fscanf(f, "dtensor-checkpoint %d step %lld seed %llu mesh %d %d %d sp %d dtype "
                          "%15s model %d %lld %lld %lld %lld %lld", &version, &s, &seed, &mesh[0],
                          &mesh[1], &mesh[2], &sp, dtype, &vocab, &L, &d, &H, &Hkv, &F) == 14;
    fclose(f);
    if (!ok || (version != 1 && version != 2)) return;
    if (!(given & GIVEN_LAYERS)) c->layers = L;
    if (!(given & GIVEN_DIM)) c->dim = d;
    if (!(given & GIVEN_HEADS)) c->heads = H;
    if (!(given & GIVEN_KV)) c->kv_heads = Hkv;
    if (!(given & GIVEN_FFN)) c->ffn = F;
    if (!(given & GIVEN_DTYPE)) (void)ex_parse_dtype("--dtype", dtype, &c->dtype);
    if (!(given & GIVEN_SEED)) c->seed = seed;
}

/* --separator's TEXT with \n, \t and \\ read: 1, or 0 if empty or too long. */
static int parse_separator(const char *v, config *c) {
    c->sep_len = 0;
    for (const char *p = v; p && *p; p++) {
        char ch = *p;
        if (ch == '\\' && (p[1] == 'n' || p[1] == 't' || p[1] == '\\'))
            ch = *++p == 'n' ? '\n' : *p == 't' ? '\t' : '\\';
        if (c->sep_len == (int)sizeof c->sep) return 0;
        c->sep[c->sep_len++] = ch;
    }
    return c->sep_len > 0;
}

/* 0 and the config, or 2 (a message printed), or 1 for --help. */
static int parse_args(int argc, char **argv, config *c) {
    memset(c, 0, sizeof *c);
    c->dp = c->tp = c->cp = 1;
    c->order = DT_ORDER_STRIPED;
    c->layers = 2, c->dim = 64, c->heads = 4, c->kv_heads = 0, c->ffn = 0;
    c->seq = 64, c->batch = 8, c->steps = 100, c->sample_chars = 200;
    c->lr = 3e-3f, c->min_lr = -1.0f, c->clip = 1.0f, c->weight_decay = 0.1f;
    c->beta1 = 0.9f, c->beta2 = 0.95f, c->eps = 1e-8f;
    c->seed = 1;
    c->dtype = DT_F32;
    c->backend = DT_BACKEND_AUTO;
    (void)parse_separator("\\n\\n", c);
    long v;
    unsigned given = 0;   /* the model's flags and --seed given (GIVEN_*) */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1, takes = 1;
#define INT_FLAG(name, lo, hi, dst) \
    else if (!strcmp(a, name)) { ok = ex_parse_int(name, val, lo, hi, &v); if (ok) dst = v; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        INT_FLAG("--ranks", 1, 1024, c->ranks)
        INT_FLAG("--dp", 1, 1024, c->dp)
        INT_FLAG("--tp", 1, 1024, c->tp)
        INT_FLAG("--cp", 1, 1024, c->cp)
        INT_FLAG("--layers", 1, MAX_LAYERS, c->layers)
        INT_FLAG("--dim", 2, 1 << 16, c->dim)
        INT_FLAG("--heads", 1, 1 << 12, c->heads)
        INT_FLAG("--kv-heads", 1, 1 << 12, c->kv_heads)
        INT_FLAG("--ffn", 1, 1 << 20, c->ffn)
        INT_FLAG("--seq", 1, 1 << 24, c->seq)
        INT_FLAG("--batch", 1, 1 << 20, c->batch)
        INT_FLAG("--steps", 0, 1L << 40, c->steps)
        INT_FLAG("--warmup", 0, 1L << 40, c->warmup)
        INT_FLAG("--save-every", 1, 1L << 40, c->save_every)
        INT_FLAG("--log-every", 1, 1L << 40, c->log_every)
        INT_FLAG("--sample", 0, 1 << 20, c->sample_chars)
        else if (!strcmp(a, "--order")) {
            static const char *const names[] = {"contiguous", "striped", "zigzag"};
            static const dt_order orders[] = {DT_ORDER_CONTIGUOUS, DT_ORDER_STRIPED, DT_ORDER_ZIGZAG};
            const int k = ex_parse_choice(a, val, names, 3);
            ok = k >= 0;
            if (ok) c->order = orders[k];
        }
        else if (!strcmp(a, "--lr")) ok = parse_float(a, val, 0, 10, &c->lr);
        else if (!strcmp(a, "--min-lr")) ok = parse_float(a, val, 0, 10, &c->min_lr);
        else if (!strcmp(a, "--clip")) ok = parse_float(a, val, 0, 1e30, &c->clip);
        else if (!strcmp(a, "--weight-decay")) ok = parse_float(a, val, 0, 10, &c->weight_decay);
        else if (!strcmp(a, "--peak-tflops")) {
            float x;
            ok = parse_float(a, val, 1e-6, 1e9, &x);
            c->peak_tflops = x;
        }
        else if (!strcmp(a, "--seed")) ok = ex_parse_seed(val, &c->seed);
        else if (!strcmp(a, "--dtype")) ok = ex_parse_dtype(a, val, &c->dtype);
        else if (!strcmp(a, "--backend")) ok = ex_parse_backend(a, val, &c->backend);
        else if (!strcmp(a, "--data")) c->data = val, ok = val != NULL;
        else if (!strcmp(a, "--dump")) c->dump = val, ok = val != NULL;
        else if (!strcmp(a, "--save")) c->save = val, ok = val != NULL;
        else if (!strcmp(a, "--resume")) c->resume = val, ok = val != NULL;
        else if (!strcmp(a, "--export")) c->export_path = val, ok = val != NULL;
        else if (!strcmp(a, "--svg")) c->svg = val, ok = val != NULL;
        else if (!strcmp(a, "--prompt")) c->prompt = val, ok = val != NULL && *val;
        else if (!strcmp(a, "--separator")) {
            ok = parse_separator(val, c);
            given |= GIVEN_SEPARATOR;
            if (!ok && val) {
                fprintf(stderr, NAME ": --separator takes 1 to %d bytes\n", (int)sizeof c->sep);
                return 2;
            }
        }
        else if (!strcmp(a, "--packed")) c->packed = 1, takes = 0;
        else if (!strcmp(a, "--sp")) c->sp = 1, takes = 0;
        else if (!strcmp(a, "--recompute")) c->recompute = 1, takes = 0;
        else if (!strcmp(a, "--cosine")) c->cosine = 1, takes = 0;
        else if (!strcmp(a, "--profile")) c->profile = 1, takes = 0;
        else if (!strcmp(a, "--comm-counts")) c->comm_counts = 1, takes = 0;
        else {
            fprintf(stderr, NAME ": unknown flag '%s' (--help lists them)\n", a);
            return 2;
        }
#undef INT_FLAG
        if (!ok) {
            if (takes && !val) fprintf(stderr, NAME ": %s needs a value\n", a);
            else if (takes && (!strcmp(a, "--data") || !strcmp(a, "--prompt")))
                fprintf(stderr, NAME ": %s needs a value\n", a);
            return 2;
        }
        static const char *const model_flags[] = {"--layers", "--dim", "--heads", "--kv-heads",
                                                  "--ffn", "--dtype", "--seed"};
        for (unsigned k = 0; k < 7; k++)
            if (!strcmp(a, model_flags[k])) given |= 1u << k;
        i += takes;
    }
    if (c->resume) resume_model(c, given);
    if (!c->kv_heads) c->kv_heads = ex_default_kv_heads(c->heads, c->tp);
    if (!c->ffn) c->ffn = (4 * c->dim + c->tp * 8 - 1) / (c->tp * 8) * (c->tp * 8);
    if (c->min_lr < 0) c->min_lr = 0.1f * c->lr;
    const long world = (long)c->dp * c->tp * c->cp;
    if (!c->ranks) c->ranks = (int)world;
    if (!c->log_every) c->log_every = c->steps > 50 ? (c->steps + 49) / 50 : 1;
    const char *why = NULL;
    char buf[200];
    if (world != c->ranks) {
        snprintf(buf, sizeof buf, "--dp %d x --tp %d x --cp %d = %ld is not --ranks %d", c->dp,
                 c->tp, c->cp, world, c->ranks);
        why = buf;
    } else if ((given & GIVEN_SEPARATOR) && !c->packed) {
        why = "--separator needs --packed (it marks where the packed documents end)";
    } else if (c->dim % c->heads) {
        snprintf(buf, sizeof buf, "--heads %lld does not divide --dim %lld", (long long)c->heads,
                 (long long)c->dim);
        why = buf;
    } else if ((c->dim / c->heads) % 2) {
        snprintf(buf, sizeof buf, "the head dim %lld (--dim / --heads) must be even (rotary pairs)",
                 (long long)(c->dim / c->heads));
        why = buf;
    } else if (c->heads % c->kv_heads) {
        snprintf(buf, sizeof buf, "--kv-heads %lld does not divide --heads %lld",
                 (long long)c->kv_heads, (long long)c->heads);
        why = buf;
    } else if (c->heads % c->tp || c->kv_heads % c->tp) {
        snprintf(buf, sizeof buf, "--tp %d must divide --heads %lld and --kv-heads %lld", c->tp,
                 (long long)c->heads, (long long)c->kv_heads);
        why = buf;
    } else if (c->ffn % c->tp || VOCAB % c->tp) {
        snprintf(buf, sizeof buf, "--tp %d must divide --ffn %lld and the vocabulary %d", c->tp,
                 (long long)c->ffn, VOCAB);
        why = buf;
    } else if (c->batch % c->dp) {
        snprintf(buf, sizeof buf, "--dp %d does not divide --batch %lld", c->dp,
                 (long long)c->batch);
        why = buf;
    } else if (c->seq % (c->order == DT_ORDER_ZIGZAG ? 2 * c->cp : c->cp)) {
        snprintf(buf, sizeof buf, "--seq %lld is not divisible by %s%d (--cp, %s)",
                 (long long)c->seq, c->order == DT_ORDER_ZIGZAG ? "2 x " : "", c->cp,
                 dt_order_name(c->order));
        why = buf;
    } else if (c->sp && c->seq % (c->tp * c->cp)) {
        snprintf(buf, sizeof buf, "--sp: --seq %lld is not divisible by --tp %d x --cp %d",
                 (long long)c->seq, c->tp, c->cp);
        why = buf;
    } else if (c->warmup > c->steps) {
        why = "--warmup is longer than --steps";
    }
    if (why) {
        fprintf(stderr, NAME ": %s\n", why);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------------ model */

enum { ATTN_NORM, WQ, WK, WV, WO, MLP_NORM, W_GATE, W_UP, W_DOWN };

typedef struct param {
    char name[48];
    int ndim;
    int64_t shape[2];
    int tp_dim;              /* the dim sharded over tp, -1 for none */
    int decay;               /* AdamW's weight decay applies (two or more dims) */
    dt_tensor *w, *master, *m, *v;
    dt_tensor *g;            /* the step's gradient, as the backward leaves it */
} param;

typedef struct op_log op_log;

typedef struct model {
    const config *c;
    dt_context *ctx;
    dt_mesh *mesh;
    int rank, world;
    param p[MAX_PARAMS];
    int np;
    int64_t Dh;
    op_log *log;   /* --profile: the matmul and attention calls are recorded here; else NULL */
    /* --packed: the documents of the batch in x (batch_tensors), as attention
     * and rotary take them (docs.h): a list per row, summing to B x S. */
    int64_t *docs, ndocs, docs_cap;
} model;

static param *P(model *M, int layer, int which) { return &M->p[1 + layer * PER_LAYER + which]; }
static param *TOK(model *M) { return &M->p[0]; }
static param *NORM(model *M) { return &M->p[M->np - 2]; }
static param *HEAD(model *M) { return &M->p[M->np - 1]; }

/* The mesh's dims: tp fastest, so a tp group is consecutive ranks. */
enum { MESH_DP, MESH_CP, MESH_TP };

/* A Layout given per axis (dp, tp, cp), on the mesh's dims (dp, cp, tp). */
static dt_layout lay(dt_placement dp, dt_placement tp, dt_placement cp) {
    return dt_layout_3d(dp, cp, tp);
}

/* The sequence's placement on cp: its order (Replicate under --sp with cp
 * 1, where the sequence is sharded over tp alone). */
static dt_placement cp_seq(const config *c) {
    return c->sp && c->cp == 1 ? dt_replicate() : dt_shard(1, c->order);
}

static dt_layout param_layout(const param *p) {
    return lay(dt_replicate(), p->tp_dim < 0 ? dt_replicate() : dt_shard(p->tp_dim, DT_ORDER_CONTIGUOUS),
               dt_replicate());
}

/* The residual stream's Layout [B, S, d] (and of rmsnorm's outputs). Under
 * --sp the sequence is sharded over tp too: cp (the outer mesh dim) takes
 * its order's part, tp cuts that in contiguous blocks. */
static dt_layout hidden_layout(const config *c) {
    return lay(dt_shard(0, DT_ORDER_CONTIGUOUS),
               c->sp ? dt_shard(1, DT_ORDER_CONTIGUOUS) : dt_replicate(), cp_seq(c));
}

/* Tokens and targets [B, S]. */
static dt_layout token_layout(const config *c) {
    return lay(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_replicate(), cp_seq(c));
}

static void model_table(model *M) {
    const config *c = M->c;
    const int64_t d = c->dim, Dh = d / c->heads, qd = c->heads * Dh, kvd = c->kv_heads * Dh;
    M->Dh = Dh;
    int n = 0;
#define ADD(nm, nd, s0, s1, tpd)                                                            \
    do {                                                                                 \
        param *p = &M->p[n++];                                                           \
        memset(p, 0, sizeof *p);                                                         \
        snprintf(p->name, sizeof p->name, "%s", nm);                                     \
        p->ndim = nd, p->shape[0] = s0, p->shape[1] = s1, p->tp_dim = tpd, p->decay = nd >= 2; \
    } while (0)
    ADD("tok_emb", 2, VOCAB, d, 0);
    for (int64_t i = 0; i < c->layers; i++) {
        char nm[48];
#define L(suffix, nd, s0, s1, tpd) \
    snprintf(nm, sizeof nm, "layers.%lld." suffix, (long long)i); ADD(nm, nd, s0, s1, tpd)
        L("attn_norm", 1, d, 0, -1);
        L("wq", 2, d, qd, 1);
        L("wk", 2, d, kvd, 1);
        L("wv", 2, d, kvd, 1);
        L("wo", 2, qd, d, 0);
        L("mlp_norm", 1, d, 0, -1);
        L("w_gate", 2, d, c->ffn, 1);
        L("w_up", 2, d, c->ffn, 1);
        L("w_down", 2, c->ffn, d, 0);
#undef L
    }
    ADD("norm", 1, d, 0, -1);
    ADD("lm_head", 2, d, VOCAB, 1);
#undef ADD
    M->np = n;
}

static int64_t param_numel(const param *p) { return p->ndim == 1 ? p->shape[0] : p->shape[0] * p->shape[1]; }

/* splitmix64: the example's one source of randomness (init and data). */
static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Normal(0, 1) from (seed, a, b), Box-Muller. */
static double normal01(uint64_t seed, uint64_t a, uint64_t b) {
    const uint64_t r1 = mix64(seed ^ mix64(a * 0x100000001B3ull + b * 2));
    const uint64_t r2 = mix64(r1 ^ 0x5851F42D4C957F2Dull);
    const double u1 = ((double)(r1 >> 11) + 1.0) / 9007199254740993.0, u2 = (double)(r2 >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* The initial values of parameter i, global and row-major, fp32: norms 1,
 * matrices Normal(0, 0.02), the residual projections (wo, w_down) scaled
 * by 1/sqrt(2 L) as GPT-2's. The same on every mesh. */
static void init_values(const model *M, int i, float *out) {
    const param *p = &M->p[i];
    const int64_t n = param_numel(p);
    if (p->ndim == 1) {
        for (int64_t j = 0; j < n; j++) out[j] = 1.0f;
        return;
    }
    double std = 0.02;
    if (strstr(p->name, ".wo") || strstr(p->name, ".w_down")) std /= sqrt(2.0 * (double)M->c->layers);
    for (int64_t j = 0; j < n; j++) out[j] = (float)(std * normal01(M->c->seed, (uint64_t)i, (uint64_t)j));
}

/* A tensor of the param's shape, Layout and `dtype`, from fp32 values. */
static dt_status make_like(model *M, const param *p, dt_dtype dtype, const float *full,
                           dt_tensor **out) {
    const dt_layout l = param_layout(p);
    dt_status st = dt_tensor_create(M->ctx, M->mesh, dtype, p->ndim, p->shape, &l, out);
    if (st != DT_SUCCESS || !full) return st;
    if (dtype == DT_F32) return dt_tensor_set_global(*out, full);
    const int64_t n = param_numel(p);
    void *h = malloc((size_t)n * dt_dtype_size(dtype));
    if (!h) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    dt_values_set(h, dtype, (size_t)n, full);
    st = dt_tensor_set_global(*out, h);
    free(h);
    return st;
}

static dt_status model_create(model *M) {
    const config *c = M->c;
    int64_t most = 0;
    for (int i = 0; i < M->np; i++) most = param_numel(&M->p[i]) > most ? param_numel(&M->p[i]) : most;
    float *full = malloc((size_t)most * sizeof *full);
    if (!full) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    dt_status st = DT_SUCCESS;
    for (int i = 0; i < M->np && st == DT_SUCCESS; i++) {
        param *p = &M->p[i];
        init_values(M, i, full);
        st = make_like(M, p, c->dtype, full, &p->w);
        if (st == DT_SUCCESS && c->dtype != DT_F32) st = make_like(M, p, DT_F32, full, &p->master);
        if (st == DT_SUCCESS) st = make_like(M, p, DT_F32, NULL, &p->m);
        if (st == DT_SUCCESS) st = make_like(M, p, DT_F32, NULL, &p->v);
    }
    free(full);
    return st;
}

static void model_destroy(model *M) {
    for (int i = 0; i < M->np; i++) {
        param *p = &M->p[i];
        dt_tensor_destroy(p->w), dt_tensor_destroy(p->master), dt_tensor_destroy(p->m);
        dt_tensor_destroy(p->v), dt_tensor_destroy(p->g);
        p->w = p->master = p->m = p->v = p->g = NULL;
    }
    free(M->docs);
    M->docs = NULL;
    M->ndocs = M->docs_cap = 0;
}

/* ------------------------------------------------------------------ data */

typedef struct corpus {
    unsigned char *bytes;
    int64_t n;
} corpus;

static dt_status corpus_read(const char *path, corpus *d) {
    FILE *f = fopen(path, "rb");
    if (!f) return dt_error(DT_ERR_INVALID_ARGUMENT, "cannot open --data %s: %s", path, strerror(errno));
    d->bytes = NULL;
    d->n = 0;
    size_t cap = 0;
    for (;;) {
        if ((size_t)d->n == cap) {
            cap = cap ? 2 * cap : 1 << 20;
            unsigned char *b = realloc(d->bytes, cap);
            if (!b) {
                fclose(f);
                return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory reading %s", path);
            }
            d->bytes = b;
        }
        const size_t got = fread(d->bytes + d->n, 1, cap - (size_t)d->n, f);
        d->n += (int64_t)got;
        if (got == 0) break;
    }
    fclose(f);
    return DT_SUCCESS;
}

/* Step s's batch: B sequences of S + 1 tokens at positions drawn from (seed,
 * s, b), the same on every rank and every mesh: seq[b * (S + 1) + t]. */
static void batch_tokens(const config *c, const corpus *d, int64_t step, int32_t *seq) {
    const int64_t span = d->n - (c->seq + 1);
    for (int64_t b = 0; b < c->batch; b++) {
        const uint64_t r = mix64(c->seed * 0x2545F4914F6CDD1Dull ^ mix64((uint64_t)step * 1000003u + (uint64_t)b));
        const int64_t pos = (int64_t)(r % (uint64_t)(span + 1));
        for (int64_t t = 0; t <= c->seq; t++) seq[b * (c->seq + 1) + t] = d->bytes[pos + t];
    }
}

/* --packed: M->docs, the lengths of the documents of the B rows of S tokens
 * of seq (rows of S + 1): a document ends after each separator, and at the
 * row's end. */
static dt_status batch_docs(model *M, int64_t B, const int32_t *seq) {
    const config *c = M->c;
    const int64_t S = c->seq, L = c->sep_len;
    M->ndocs = 0;
    if (!c->packed) return DT_SUCCESS;
    if (M->docs_cap < B * S) {
        int64_t *d = realloc(M->docs, (size_t)(B * S) * sizeof *d);
        if (!d) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
        M->docs = d;
        M->docs_cap = B * S;
    }
    for (int64_t b = 0; b < B; b++) {
        const int32_t *row = seq + b * (S + 1);
        int64_t start = 0;
        for (int64_t t = 1; t <= S; t++) {   /* does a document end before token t? */
            int ends = t == S || t >= L;
            for (int64_t i = 0; t < S && ends && i < L; i++)
                ends = row[t - L + i] == (unsigned char)c->sep[i];
            if (!ends) continue;
            M->docs[M->ndocs++] = t - start;
            start = t;
        }
    }
    return DT_SUCCESS;
}

/* x (and y, if wanted) [B, S]: the tokens and targets of B sequences of S + 1;
 * with --packed, their documents in M->docs. */
static dt_status batch_tensors(model *M, int64_t B, const int32_t *seq, dt_tensor **x,
                               dt_tensor **y) {
    const config *c = M->c;
    DT_TRY(batch_docs(M, B, seq));
    const int64_t shape[2] = {B, c->seq};
    const dt_layout l = token_layout(c);
    int32_t *xs = malloc((size_t)(B * c->seq) * 2 * sizeof *xs);
    if (!xs) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    int32_t *ys = xs + B * c->seq;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < c->seq; t++) {
            xs[b * c->seq + t] = seq[b * (c->seq + 1) + t];
            ys[b * c->seq + t] = seq[b * (c->seq + 1) + t + 1];
        }
    dt_status st = dt_tensor_create(M->ctx, M->mesh, DT_I32, 2, shape, &l, x);
    if (st == DT_SUCCESS) st = dt_tensor_set_global(*x, xs);
    if (st == DT_SUCCESS && y) st = dt_tensor_create(M->ctx, M->mesh, DT_I32, 2, shape, &l, y);
    if (st == DT_SUCCESS && y) st = dt_tensor_set_global(*y, ys);
    free(xs);
    return st;
}

/* ------------------------------------------------------------ recorded calls */

/* The model calls dt_matmul, dt_matmul_backward and attention through the
 * wrappers below, which also note each call in M->log while --profile
 * records a step: what its tensors were (not their values), so that
 * profile() can time the same calls alone on fresh random tensors. */

/* A tensor's description: enough to make another like it. */
typedef struct tensor_desc {
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    dt_layout layout;
} tensor_desc;

typedef enum {
    OP_MATMUL, OP_MATMUL_BACKWARD, OP_ATTENTION, OP_ATTENTION_BACKWARD, OP_KINDS
} op_kind;
static const char *const op_names[OP_KINDS] = {"dt_matmul", "dt_matmul_backward",
                                               "dt_attention_forward", "dt_attention_backward"};

/* How a backward call wants a gradient (ops.h): not, as a new tensor, or
 * added into an existing one (described in op_rec.into). */
typedef enum { GRAD_NONE, GRAD_NEW, GRAD_ADD } grad_use;

typedef struct op_rec {
    op_kind kind;
    tensor_desc in[3];         /* x, w and (backward) dy; attention: q, k, v */
    grad_use grad[2];          /* matmul backward: dx, dw */
    tensor_desc into[2];       /* the tensors dx, dw were added into (GRAD_ADD) */
    dt_attention_options ao;   /* attention: the call's options */
    dt_tensor *arg[4];         /* the replay's random in[] (and attention backward's
                                  dout), made once, owned; as the step's, one per call */
} op_rec;

/* A step's calls, in order (every rank records the same sequence). */
#define MAX_OPS (MAX_LAYERS * 32 + 8)
struct op_log {
    op_rec op[MAX_OPS];
    int n;
    int overflow;   /* more than MAX_OPS calls: the log is incomplete */
};

static void describe(const dt_tensor *t, tensor_desc *d) {
    memset(d, 0, sizeof *d);
    d->dtype = dt_tensor_dtype(t);
    d->ndim = dt_tensor_ndim(t);
    memcpy(d->shape, dt_tensor_shape(t), (size_t)d->ndim * sizeof d->shape[0]);
    d->layout = *dt_tensor_layout(t);
}

/* The next record of M->log, or NULL when nothing records (or it is full). */
static op_rec *note(model *M, op_kind kind) {
    op_log *g = M->log;
    if (!g) return NULL;
    if (g->n == MAX_OPS) {
        g->overflow = 1;
        return NULL;
    }
    op_rec *r = &g->op[g->n++];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    return r;
}

static dt_status matmul(model *M, const dt_tensor *x, const dt_tensor *w, dt_tensor **out) {
    op_rec *r = note(M, OP_MATMUL);
    if (r) describe(x, &r->in[0]), describe(w, &r->in[1]);
    return dt_matmul(x, w, out);
}

static void note_grad(op_rec *r, int i, dt_tensor **g) {
    r->grad[i] = !g ? GRAD_NONE : *g ? GRAD_ADD : GRAD_NEW;
    if (r->grad[i] == GRAD_ADD) describe(*g, &r->into[i]);
}

static dt_status matmul_backward(model *M, const dt_tensor *x, const dt_tensor *w,
                                 const dt_tensor *dy, dt_tensor **dx, dt_tensor **dw) {
    op_rec *r = note(M, OP_MATMUL_BACKWARD);
    if (r) {
        describe(x, &r->in[0]), describe(w, &r->in[1]), describe(dy, &r->in[2]);
        note_grad(r, 0, dx), note_grad(r, 1, dw);
    }
    return dt_matmul_backward(x, w, dy, dx, dw);
}

/* Attention with o and lse wanted, as the layers call it. COLLECTIVE. */
static dt_status attention(model *M, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                           const dt_attention_options *ao, dt_tensor **o, dt_tensor **lse) {
    op_rec *r = note(M, OP_ATTENTION);
    if (r) describe(q, &r->in[0]), describe(k, &r->in[1]), describe(v, &r->in[2]), r->ao = *ao;
    return dt_attention_forward(q, k, v, ao, o, lse);
}

/* COLLECTIVE. */
static dt_status attention_backward(model *M, const dt_tensor *q, const dt_tensor *k,
                                    const dt_tensor *v, const dt_tensor *o, const dt_tensor *lse,
                                    const dt_tensor *dout, const dt_attention_options *ao,
                                    dt_tensor **dq, dt_tensor **dk, dt_tensor **dv) {
    op_rec *r = note(M, OP_ATTENTION_BACKWARD);
    if (r) describe(q, &r->in[0]), describe(k, &r->in[1]), describe(v, &r->in[2]), r->ao = *ao;
    return dt_attention_backward(q, k, v, o, lse, dout, ao, dq, dk, dv);
}

/* ------------------------------------------------------------ forward */

/* t under Layout l (a copy when it has it already). */
static dt_status to(const dt_tensor *t, dt_layout l, dt_tensor **out) {
    return dt_tensor_redistribute(t, &l, out);
}

/* What a layer keeps for its backward (all of it, or only h with --recompute). */
typedef struct cache {
    dt_tensor *h;                  /* the layer's input [B, S, d], owned */
    dt_tensor *a, *af;             /* rmsnorm(h); af: a made whole over tp (--sp), else NULL */
    dt_tensor *q3, *k3, *v3;       /* [B, S, H*Dh], [B, S, Hkv*Dh] */
    dt_tensor *q, *k, *v;          /* [B, S, H|Hkv, Dh] */
    dt_tensor *qr, *kr;            /* q, k rotated */
    dt_tensor *o, *lse, *o3;       /* attention's output, log-sum-exp, o as [B, S, H*Dh] */
    dt_tensor *h1;                 /* h + attention */
    dt_tensor *mm, *mf;            /* rmsnorm(h1); mf whole over tp (--sp) */
    dt_tensor *gt, *up, *sw;       /* m @ w_gate, m @ w_up, swiglu */
} cache;

/* Everything but h (recompute keeps h). */
static void cache_drop(cache *c) {
    dt_tensor **t[] = {&c->a, &c->af, &c->q3, &c->k3, &c->v3, &c->q, &c->k, &c->v, &c->qr, &c->kr,
                       &c->o, &c->lse, &c->o3, &c->h1, &c->mm, &c->mf, &c->gt, &c->up, &c->sw};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        dt_tensor_destroy(*t[i]);
        *t[i] = NULL;
    }
}

/* Both take the batch's documents (--packed: each from position 0, and
 * attention inside each). */
static dt_rotary_options rope(const model *M) {
    dt_rotary_options r = DT_ROTARY_OPTIONS_INIT;
    r.base = ROPE_BASE;
    r.style = DT_ROTARY_HALF;
    r.doc_lens = M->ndocs ? M->docs : NULL;
    r.doc_count = M->ndocs;
    return r;
}

static dt_attention_options attn_opts(const model *M) {
    dt_attention_options o = DT_ATTENTION_OPTIONS_INIT;
    o.mask = DT_ATTN_CAUSAL;   /* scale 0: 1/sqrt(Dh) */
    o.doc_lens = M->ndocs ? M->docs : NULL;
    o.doc_count = M->ndocs;
    return o;
}

/* The input of column-parallel matmuls: x, or under --sp x made whole over
 * tp (the sequence still sharded over cp). */
static dt_status whole_over_tp(const config *c, const dt_tensor *x, dt_tensor **out) {
    if (!c->sp) return DT_SUCCESS;
    return to(x, lay(dt_shard(0, DT_ORDER_CONTIGUOUS), dt_replicate(), cp_seq(c)), out);
}

/* x @ w (Partial over tp) added to r, back in the residual's Layout: an
 * all-reduce over tp, or under --sp a reduce-scatter. */
static dt_status add_row_parallel(model *M, const dt_tensor *r, const dt_tensor *x,
                                  const dt_tensor *w, dt_tensor **out) {
    dt_tensor *p = NULL, *s = NULL;
    dt_status st = matmul(M, x, w, &p);
    if (st == DT_SUCCESS) st = to(p, hidden_layout(M->c), &s);
    if (st == DT_SUCCESS) st = dt_add(r, s, out);
    dt_tensor_destroy(p);
    dt_tensor_destroy(s);
    return st;
}

/* Layer i on c->h: fills c, and *out = the layer's output. */
static dt_status layer_forward(model *M, int i, cache *c, dt_tensor **out) {
    const config *cf = M->c;
    const int64_t B = dt_tensor_shape(c->h)[0], S = dt_tensor_shape(c->h)[1], Dh = M->Dh;
    const int64_t q4[4] = {B, S, cf->heads, Dh}, kv4[4] = {B, S, cf->kv_heads, Dh};
    const dt_rotary_options r = rope(M);
    const dt_attention_options ao = attn_opts(M);
    dt_status st;
    DT_TRY(dt_rmsnorm(c->h, P(M, i, ATTN_NORM)->w, NORM_EPS, &c->a));
    DT_TRY(whole_over_tp(cf, c->a, &c->af));
    const dt_tensor *a = c->af ? c->af : c->a;
    DT_TRY(matmul(M, a, P(M, i, WQ)->w, &c->q3));
    DT_TRY(matmul(M, a, P(M, i, WK)->w, &c->k3));
    DT_TRY(matmul(M, a, P(M, i, WV)->w, &c->v3));
    DT_TRY(dt_tensor_reshape(c->q3, 4, q4, &c->q));
    DT_TRY(dt_tensor_reshape(c->k3, 4, kv4, &c->k));
    DT_TRY(dt_tensor_reshape(c->v3, 4, kv4, &c->v));
    DT_TRY(dt_rotary(c->q, &r, &c->qr));
    DT_TRY(dt_rotary(c->k, &r, &c->kr));
    DT_TRY(attention(M, c->qr, c->kr, c->v, &ao, &c->o, &c->lse));
    const int64_t o3[3] = {B, S, cf->heads * Dh};
    DT_TRY(dt_tensor_reshape(c->o, 3, o3, &c->o3));
    DT_TRY(add_row_parallel(M, c->h, c->o3, P(M, i, WO)->w, &c->h1));
    DT_TRY(dt_rmsnorm(c->h1, P(M, i, MLP_NORM)->w, NORM_EPS, &c->mm));
    DT_TRY(whole_over_tp(cf, c->mm, &c->mf));
    const dt_tensor *m = c->mf ? c->mf : c->mm;
    DT_TRY(matmul(M, m, P(M, i, W_GATE)->w, &c->gt));
    DT_TRY(matmul(M, m, P(M, i, W_UP)->w, &c->up));
    DT_TRY(dt_swiglu(c->gt, c->up, &c->sw));
    st = add_row_parallel(M, c->h1, c->sw, P(M, i, W_DOWN)->w, out);
    return st;
}

/* The gradient of a row-parallel output (Partial over tp) from that of its
 * reduction in the residual's Layout: the redistribution's backward,
 * Partial read as Replicate (under --sp an all-gather). */
static dt_status row_parallel_grad(const dt_tensor *dy, dt_tensor **out) {
    dt_layout g = dt_layout_grad(dt_tensor_layout(dy));
    g.placements[MESH_TP] = dt_replicate();
    return to(dy, g, out);
}

/* Layer i's backward: dy, the gradient of its output (consumed), gives
 * *dx, that of its input; the weights' gradients are added into their g. */
static dt_status layer_backward(model *M, int i, cache *c, dt_tensor *dy, dt_tensor **dx) {
    const config *cf = M->c;
    const dt_rotary_options r = rope(M);
    const dt_attention_options ao = attn_opts(M);
    dt_tensor *t = NULL, *d1 = NULL, *d2 = NULL, *d3 = NULL, *dk = NULL, *dv = NULL, *dq = NULL;
    dt_tensor *dqr = NULL, *dkr = NULL, *dq3 = NULL, *dk3 = NULL, *dv3 = NULL;
    dt_status st = DT_SUCCESS;
    if (!c->a) {   /* --recompute: the forward again, its output dropped */
        dt_tensor *out = NULL;
        st = layer_forward(M, i, c, &out);
        dt_tensor_destroy(out);
        if (st != DT_SUCCESS) goto out;
    }
    const dt_tensor *m = c->mf ? c->mf : c->mm, *a = c->af ? c->af : c->a;
    /* h2 = h1 + (swiglu(m @ w_gate, m @ w_up) @ w_down), reduced over tp */
    DT_TRY_GOTO(st, row_parallel_grad(dy, &t), out);
    DT_TRY_GOTO(st, matmul_backward(M, c->sw, P(M, i, W_DOWN)->w, t, &d1, &P(M, i, W_DOWN)->g),
                out);
    DT_TRY_GOTO(st, dt_swiglu_backward(c->gt, c->up, d1, &d2, &d3), out);
    dt_tensor_destroy(t), dt_tensor_destroy(d1);
    t = d1 = NULL;
    DT_TRY_GOTO(st, matmul_backward(M, m, P(M, i, W_GATE)->w, d2, &t, &P(M, i, W_GATE)->g), out);
    DT_TRY_GOTO(st, matmul_backward(M, m, P(M, i, W_UP)->w, d3, &t, &P(M, i, W_UP)->g), out);
    DT_TRY_GOTO(st, dt_tensor_grad_reduce(t, c->mm, &d1), out);   /* Megatron's f: all-reduce */
    /* the residual's gradient passes through; the norm's is added to it */
    DT_TRY_GOTO(st, dt_rmsnorm_backward(c->h1, P(M, i, MLP_NORM)->w, NORM_EPS, d1, &dy,
                                        &P(M, i, MLP_NORM)->g), out);
    dt_tensor_destroy(t), dt_tensor_destroy(d1), dt_tensor_destroy(d2), dt_tensor_destroy(d3);
    t = d1 = d2 = d3 = NULL;
    /* h1 = h + attention(...) @ wo, reduced over tp */
    DT_TRY_GOTO(st, row_parallel_grad(dy, &t), out);
    DT_TRY_GOTO(st, matmul_backward(M, c->o3, P(M, i, WO)->w, t, &d1, &P(M, i, WO)->g), out);
    DT_TRY_GOTO(st, dt_tensor_reshape_backward(c->o, d1, &d2), out);
    DT_TRY_GOTO(st, attention_backward(M, c->qr, c->kr, c->v, c->o, c->lse, d2, &ao, &dqr, &dkr, &dv),
                out);
    DT_TRY_GOTO(st, dt_rotary_backward(c->q, &r, dqr, &dq), out);
    DT_TRY_GOTO(st, dt_rotary_backward(c->k, &r, dkr, &dk), out);
    DT_TRY_GOTO(st, dt_tensor_reshape_backward(c->q3, dq, &dq3), out);
    DT_TRY_GOTO(st, dt_tensor_reshape_backward(c->k3, dk, &dk3), out);
    DT_TRY_GOTO(st, dt_tensor_reshape_backward(c->v3, dv, &dv3), out);
    dt_tensor_destroy(t), dt_tensor_destroy(d1), dt_tensor_destroy(d2);
    t = d1 = d2 = NULL;
    DT_TRY_GOTO(st, matmul_backward(M, a, P(M, i, WQ)->w, dq3, &t, &P(M, i, WQ)->g), out);
    DT_TRY_GOTO(st, matmul_backward(M, a, P(M, i, WK)->w, dk3, &t, &P(M, i, WK)->g), out);
    DT_TRY_GOTO(st, matmul_backward(M, a, P(M, i, WV)->w, dv3, &t, &P(M, i, WV)->g), out);
    DT_TRY_GOTO(st, dt_tensor_grad_reduce(t, c->a, &d1), out);
    DT_TRY_GOTO(st, dt_rmsnorm_backward(c->h, P(M, i, ATTN_NORM)->w, NORM_EPS, d1, &dy,
                                        &P(M, i, ATTN_NORM)->g), out);
    *dx = dy;
    dy = NULL;
out:
    dt_tensor_destroy(dy);
    dt_tensor *all[] = {t, d1, d2, d3, dk, dv, dq, dqr, dkr, dq3, dk3, dv3};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) dt_tensor_destroy(all[k]);
    if (cf->recompute) cache_drop(c);
    return st;
}

/* h0 = tok_emb[x] in the residual's Layout (the vocab-parallel lookup is
 * Partial over tp: all-reduced, or reduce-scattered under --sp). */
static dt_status embed(model *M, const dt_tensor *x, dt_tensor **h0) {
    dt_tensor *e = NULL;
    dt_status st = dt_embedding(TOK(M)->w, x, &e);
    if (st == DT_SUCCESS) st = to(e, hidden_layout(M->c), h0);
    dt_tensor_destroy(e);
    return st;
}

/* logits = rmsnorm(h, norm) @ lm_head, vocab-parallel; *n and *nf kept for
 * the backward (nf NULL but under --sp). */
static dt_status head_forward(model *M, const dt_tensor *h, dt_tensor **n, dt_tensor **nf,
                              dt_tensor **logits) {
    DT_TRY(dt_rmsnorm(h, NORM(M)->w, NORM_EPS, n));
    DT_TRY(whole_over_tp(M->c, *n, nf));
    return matmul(M, *nf ? *nf : *n, HEAD(M)->w, logits);
}

/* One forward and backward over a batch: *loss (the global mean), every
 * parameter's g filled. */
static dt_status forward_backward(model *M, const dt_tensor *x, const dt_tensor *y, float *loss) {
    const config *c = M->c;
    const int L = (int)c->layers;
    cache caches[MAX_LAYERS];
    memset(caches, 0, sizeof caches);
    dt_tensor *hL = NULL, *n = NULL, *nf = NULL, *logits = NULL, *dlogits = NULL, *dn = NULL;
    dt_tensor *dnr = NULL, *dh = NULL, *de = NULL;
    dt_status st;
    DT_TRY_GOTO(st, embed(M, x, &caches[0].h), out);
    for (int i = 0; i < L; i++) {
        dt_tensor **next = i + 1 < L ? &caches[i + 1].h : &hL;
        DT_TRY_GOTO(st, layer_forward(M, i, &caches[i], next), out);
        if (c->recompute) cache_drop(&caches[i]);
    }
    DT_TRY_GOTO(st, head_forward(M, hL, &n, &nf, &logits), out);
    const dt_cross_entropy_options co = DT_CROSS_ENTROPY_OPTIONS_INIT;
    DT_TRY_GOTO(st, dt_cross_entropy(logits, y, &co, loss, &dlogits), out);
    dt_tensor_destroy(logits);
    logits = NULL;
    DT_TRY_GOTO(st, matmul_backward(M, nf ? nf : n, HEAD(M)->w, dlogits, &dn, &HEAD(M)->g), out);
    DT_TRY_GOTO(st, dt_tensor_grad_reduce(dn, n, &dnr), out);
    DT_TRY_GOTO(st, dt_rmsnorm_backward(hL, NORM(M)->w, NORM_EPS, dnr, &dh, &NORM(M)->g), out);
    for (int i = L - 1; i >= 0; i--) {
        dt_tensor *dx = NULL;
        st = layer_backward(M, i, &caches[i], dh, &dx);
        dh = dx;
        cache_drop(&caches[i]);
        if (st != DT_SUCCESS) goto out;
    }
    {   /* the embedding's output was Partial over tp: its gradient is Replicate */
        dt_layout g = dt_layout_grad(dt_tensor_layout(dh));
        g.placements[MESH_TP] = dt_replicate();
        DT_TRY_GOTO(st, to(dh, g, &de), out);
    }
    DT_TRY_GOTO(st, dt_embedding_backward(TOK(M)->w, x, de, &TOK(M)->g), out);
out:
    for (int i = 0; i < L; i++) {
        cache_drop(&caches[i]);
        dt_tensor_destroy(caches[i].h);
    }
    dt_tensor *all[] = {hL, n, nf, logits, dlogits, dn, dnr, dh, de};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) dt_tensor_destroy(all[k]);
    return st;
}

static dt_status gather_write(dt_tensor *const *t, int count, FILE *f);

/* The learning rate of step s (from 0): linear warmup, then constant or
 * cosine to min_lr. */
static float lr_at(const config *c, int64_t s) {
    if (s < c->warmup) return c->lr * (float)(s + 1) / (float)c->warmup;
    if (!c->cosine) return c->lr;
    const double span = (double)(c->steps - c->warmup), t = span > 0 ? (double)(s - c->warmup) / span : 1.0;
    return (float)(c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(3.141592653589793 * t)));
}

/* Reduces every gradient to its parameter's Layout, clips by the global norm
 * and steps AdamW (step s from 0). *norm: the norm before clipping. dump
 * (the same on every rank): the gradients are gathered, and rank 0 writes
 * them to grads (--dump's grad0.bin). */
static dt_status optimizer_step(model *M, int64_t s, float lr, int dump, FILE *grads,
                                double *norm) {
    const config *c = M->c;
    dt_tensor *red[MAX_PARAMS] = {0};
    double sq = 0.0, x[MAX_PARAMS];
    const dt_tensor *g[MAX_PARAMS], *w[MAX_PARAMS];
    for (int i = 0; i < M->np; i++) g[i] = M->p[i].g, w[i] = M->p[i].w;
    /* each gradient in its parameter's Layout, its all-reduces in buckets */
    dt_status st = dt_tensor_grad_reduce_n(g, w, M->np, red);
    if (st == DT_SUCCESS) st = dt_tensor_sum_squares_n((const dt_tensor *const *)red, M->np, x);
    for (int i = 0; st == DT_SUCCESS && i < M->np; i++) sq += x[i];
    if (st == DT_SUCCESS && dump) st = gather_write(red, M->np, grads);   /* collective */
    *norm = sqrt(sq);
    const double coef = c->clip > 0 ? (double)c->clip / (*norm + 1e-6) : 1.0;
    const float scale = coef < 1.0 ? (float)coef : 1.0f;
    for (int i = 0; i < M->np && st == DT_SUCCESS; i++) {
        param *p = &M->p[i];
        dt_adamw_options o = {lr, c->beta1, c->beta2, c->eps, p->decay ? c->weight_decay : 0.0f};
        st = dt_adamw_step(p->w, p->master, p->m, p->v, red[i], scale, &o, s + 1);
    }
    for (int i = 0; i < M->np; i++) {
        dt_tensor_destroy(red[i]);
        dt_tensor_destroy(M->p[i].g);
        M->p[i].g = NULL;
    }
    return st;
}

/* ------------------------------------------------------------ reports */

/* The sum over the mesh's ranks of each one's v[0..n) (a Partial tensor
 * made Replicate), the same on every rank. */
static dt_status mesh_sum(model *M, double *v, int n) {
    const int64_t shape[1] = {2 * (int64_t)n};
    const dt_layout part = lay(dt_partial(), dt_partial(), dt_partial());
    float *h = malloc((size_t)(2 * n) * sizeof *h);
    if (!h) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < n; i++) h[2 * i] = (float)v[i], h[2 * i + 1] = (float)(v[i] - (double)(float)v[i]);
    dt_tensor *t = NULL, *s = NULL;
    dt_status st = dt_tensor_create(M->ctx, M->mesh, DT_F32, 1, shape, &part, &t);
    if (st == DT_SUCCESS) st = dt_tensor_set_local(t, h, (size_t)(2 * n) * sizeof(float));
    if (st == DT_SUCCESS) st = dt_tensor_replicate(t, &s);
    if (st == DT_SUCCESS) st = dt_tensor_get_local(s, h, (size_t)(2 * n) * sizeof(float));
    for (int i = 0; st == DT_SUCCESS && i < n; i++) v[i] = (double)h[2 * i] + (double)h[2 * i + 1];
    dt_tensor_destroy(t);
    dt_tensor_destroy(s);
    free(h);
    return st;
}

/* This process's resident memory in KiB (Linux: /proc/self/statm), or -1. */
static double rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = -1, resident = -1;
    if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
    if (f) fclose(f);
    return resident < 0 ? -1.0 : (double)resident * 4.0;
}

/* Rank 0 prints each rank's backend memory: its peak over the run, and
 * whether a step after the first took any new memory (in use and peak as
 * after the first step, and no block from the system); and rank 0's process's
 * resident memory after the first step and at the end. COLLECTIVE (mesh_sum). */
static dt_status report_memory(model *M, const dt_memory_stats *first, double rss_first) {
    dt_memory_stats now;
    DT_TRY(dt_context_memory(M->ctx, &now));
    const int grew = now.in_use > first->in_use || now.peak > first->peak ||
                     now.system_allocs > first->system_allocs;
    const int n = M->world;
    double *v = calloc((size_t)(2 * n), sizeof *v);
    if (!v) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    v[M->rank] = (double)now.peak / (1 << 20);
    v[n + M->rank] = grew;
    dt_status st = mesh_sum(M, v, 2 * n);
    if (st == DT_SUCCESS && M->rank == 0) {
        int any = 0;
        printf(NAME ": peak memory per rank (MiB):");
        for (int r = 0; r < n; r++) printf(" %.2f", v[r]), any |= v[n + r] > 0.5;
        printf("\n" NAME ": after the first step: %s\n",
               any ? "memory grew on some rank" : "no step took new memory on any rank");
        const double rss = rss_kib();
        if (rss_first > 0 && rss > 0)
            printf(NAME ": resident memory (rank 0's process) %.0f KiB after the first step, "
                   "%.0f KiB at the end\n", rss_first, rss);
    }
    free(v);
    return st;
}

/* Model flops per token of a training step (forward and backward, 3x the
 * forward's): 6 x the parameters of the matmuls (the embedding is a lookup,
 * not counted), plus causal attention's QK^T and PV, 6 L S H Dh. */
static double flops_per_token(const model *M) {
    double n = 0;
    for (int i = 1; i < M->np; i++)
        if (M->p[i].ndim == 2) n += (double)param_numel(&M->p[i]);
    const config *c = M->c;
    return 6.0 * n + 6.0 * (double)c->layers * (double)c->seq * (double)(c->heads * M->Dh);
}

/* The mesh's peak, TFLOPS: every rank times a 512 x 512 x 512 matmul in the
 * training dtype at once (ranks sharing cores or a GPU share them here too),
 * and the ranks' figures are summed. */
static dt_status measure_peak(model *M, double *tflops) {
    const int64_t n = 512, shape[2] = {n, n};
    dt_tensor *a = NULL, *b = NULL, *o = NULL;
    dt_status st = dt_tensor_create(M->ctx, NULL, M->c->dtype, 2, shape, NULL, &a);
    if (st == DT_SUCCESS) st = dt_tensor_create(M->ctx, NULL, M->c->dtype, 2, shape, NULL, &b);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(a, 1);
    if (st == DT_SUCCESS) st = dt_tensor_fill_random(b, 2);
    double best = 0.0;
    void *host = malloc((size_t)(n * n) * sizeof(float));
    if (!host && st == DT_SUCCESS) st = dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int rep = 0; rep < 4 && st == DT_SUCCESS; rep++) {
        const double t0 = ex_now_s();
        st = dt_matmul(a, b, &o);
        if (st == DT_SUCCESS)   /* returns once the work is done */
            st = dt_tensor_get_local(o, host, dt_tensor_local_bytes(o));
        const double s = ex_now_s() - t0;
        dt_tensor_destroy(o);
        o = NULL;
        if (rep > 0 && s > 0) best = fmax(best, 2.0 * (double)(n * n * n) / s / 1e12);
    }
    free(host);
    dt_tensor_destroy(a);
    dt_tensor_destroy(b);
    if (st == DT_SUCCESS) st = mesh_sum(M, &best, 1);
    *tflops = best;
    return st;
}

/* The loss curve as an SVG polyline. */
static void write_svg(const char *path, const float *loss, int64_t first, int64_t n) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, NAME ": cannot write --svg %s: %s\n", path, strerror(errno));
        return;
    }
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(loss[i])) lo = fminf(lo, loss[i]), hi = fmaxf(hi, loss[i]);
    if (!(hi > lo)) hi = lo + 1.0f;
    const double W = 640, H = 360, m = 40;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
               "<text x=\"%g\" y=\"20\" font-family=\"sans-serif\" font-size=\"14\">" NAME
               ": training loss, steps %lld to %lld</text>\n"
               "<text x=\"4\" y=\"%g\" font-family=\"sans-serif\" font-size=\"11\">%.3f</text>\n"
               "<text x=\"4\" y=\"%g\" font-family=\"sans-serif\" font-size=\"11\">%.3f</text>\n"
               "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"",
            W, H, m, (long long)first, (long long)(first + n - 1), m, (double)hi, H - m, (double)lo);
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(loss[i])) continue;
        const double x = m + (W - 2 * m) * (n > 1 ? (double)i / (double)(n - 1) : 0.0);
        const double y = H - m - (H - 2 * m) * ((double)loss[i] - lo) / (double)(hi - lo);
        fprintf(f, "%.1f,%.1f ", x, y);
    }
    fprintf(f, "\"/>\n</svg>\n");
    fclose(f);
}

/* ------------------------------------------------------------ --profile */

#define PROFILE_REPS 5

/* A new zeroed tensor as described, on the model's mesh. */
static dt_status tensor_like(model *M, const tensor_desc *d, dt_tensor **out) {
    return dt_tensor_create(M->ctx, M->mesh, d->dtype, d->ndim, d->shape, &d->layout, out);
}

/* *out: r->arg[k], a random tensor as described (from seed), made on first use. */
static dt_status replay_arg(model *M, op_rec *r, int k, const tensor_desc *d, uint64_t seed,
                            dt_tensor **out) {
    if (!r->arg[k]) {
        dt_tensor *t = NULL;
        DT_TRY(tensor_like(M, d, &t));
        const dt_status st = dt_tensor_fill_random(t, seed);
        if (st != DT_SUCCESS) {
            dt_tensor_destroy(t);
            return st;
        }
        r->arg[k] = t;
    }
    *out = r->arg[k];
    return DT_SUCCESS;
}

/* Returns once the rank's queued work is done (CUDA: its compute stream;
 * on the CPU every call is done when it returns). probe: any small tensor. */
static dt_status rank_wait(const dt_tensor *probe) {
    float v;
    return dt_tensor_get_local(probe, &v, sizeof v);
}

/* *ms: the time of r's call alone, on r's random tensors (seeds from
 * index): outputs new, gradients added into zeroed tensors where the step
 * added them. An attention backward runs after an untimed forward (its o
 * and lse). Attention calls are COLLECTIVE. */
static dt_status replay(model *M, op_rec *r, int index, const dt_tensor *probe, double *ms) {
    const uint64_t seed = 4 * (uint64_t)index + 1;
    dt_tensor *in[3] = {NULL, NULL, NULL}, *out[3] = {NULL, NULL, NULL};
    dt_tensor *o = NULL, *lse = NULL, *dout = NULL;
    dt_status st = DT_SUCCESS;
    *ms = 0.0;
    for (int i = 0; i < (r->kind == OP_MATMUL ? 2 : 3) && st == DT_SUCCESS; i++)
        st = replay_arg(M, r, i, &r->in[i], seed + (uint64_t)i, &in[i]);
    for (int i = 0; i < 2 && r->kind == OP_MATMUL_BACKWARD && st == DT_SUCCESS; i++)
        if (r->grad[i] == GRAD_ADD) st = tensor_like(M, &r->into[i], &out[i]);
    if (r->kind == OP_ATTENTION_BACKWARD && st == DT_SUCCESS) {
        tensor_desc d;
        st = dt_attention_forward(in[0], in[1], in[2], &r->ao, &o, &lse);
        if (st == DT_SUCCESS) describe(o, &d), st = replay_arg(M, r, 3, &d, seed + 3, &dout);
    }
    if (st == DT_SUCCESS) st = rank_wait(probe);
    const double t0 = ex_now_s();
    if (st == DT_SUCCESS) switch (r->kind) {
        case OP_MATMUL:
            st = dt_matmul(in[0], in[1], &out[0]);
            break;
        case OP_MATMUL_BACKWARD:
            st = dt_matmul_backward(in[0], in[1], in[2], r->grad[0] != GRAD_NONE ? &out[0] : NULL,
                                    r->grad[1] != GRAD_NONE ? &out[1] : NULL);
            break;
        case OP_ATTENTION:
            st = dt_attention_forward(in[0], in[1], in[2], &r->ao, &out[0], &out[1]);
            break;
        default:
            st = dt_attention_backward(in[0], in[1], in[2], o, lse, dout, &r->ao, &out[0], &out[1],
                                       &out[2]);
            break;
    }
    if (st == DT_SUCCESS) st = rank_wait(probe);
    *ms = 1e3 * (ex_now_s() - t0);
    for (int i = 0; i < 3; i++) dt_tensor_destroy(out[i]);
    dt_tensor_destroy(o), dt_tensor_destroy(lse);
    return st;
}

/* --profile, after the run: every rank times PROFILE_REPS whole steps on
 * the batch x, y (forward_backward and optimizer_step as step s), each
 * followed by the step's matmul calls alone and its attention calls alone
 * (recorded in a warm-up step, replayed in order, each call timed, summed);
 * medians. Rank 0 prints its figures and, on a mesh, each one's maximum
 * over the ranks. COLLECTIVE. Steps the parameters. */
static dt_status profile(model *M, const dt_tensor *x, const dt_tensor *y, int64_t s) {
    const config *c = M->c;
    dt_comm *world = dt_context_comm(M->ctx);
    op_log *log = calloc(1, sizeof *log);
    dt_tensor *probe = NULL;
    double t[3][PROFILE_REPS];   /* step, matmuls, attention: ms */
    const int64_t one = 1;
    dt_status st = log ? dt_tensor_create(M->ctx, NULL, DT_F32, 1, &one, NULL, &probe)
                       : dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int rep = -1; rep < PROFILE_REPS && st == DT_SUCCESS; rep++) {   /* -1: the warm-up */
        float loss;
        double norm, ms[3] = {0.0, 0.0, 0.0};
        M->log = rep < 0 ? log : NULL;
        st = dt_comm_barrier(world);
        const double t0 = ex_now_s();
        if (st == DT_SUCCESS) st = forward_backward(M, x, y, &loss);
        if (st == DT_SUCCESS) st = optimizer_step(M, s, lr_at(c, s), 0, NULL, &norm);
        if (st == DT_SUCCESS) st = rank_wait(probe);
        ms[0] = 1e3 * (ex_now_s() - t0);
        M->log = NULL;
        if (st == DT_SUCCESS && log->overflow)
            st = dt_error(DT_ERR_INTERNAL, "--profile: a step made more than %d calls", MAX_OPS);
        if (st == DT_SUCCESS) st = dt_comm_barrier(world);
        for (int i = 0; i < log->n && st == DT_SUCCESS; i++) {
            const op_kind k = log->op[i].kind;
            double one_ms;
            st = replay(M, &log->op[i], i, probe, &one_ms);
            ms[k == OP_MATMUL || k == OP_MATMUL_BACKWARD ? 1 : 2] += one_ms;
        }
        for (int k = 0; k < 3 && rep >= 0; k++) t[k][rep] = ms[k];
    }
    const int n = M->world;
    double *v = st == DT_SUCCESS ? calloc((size_t)(5 * n), sizeof *v) : NULL;
    if (st == DT_SUCCESS && !v) st = dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    if (st == DT_SUCCESS) {   /* this rank's step, matmuls, attention, the rest, the rest in % */
        double *mine = v + 5 * M->rank;
        for (int k = 0; k < 3; k++) mine[k] = ex_median(t[k], PROFILE_REPS);
        mine[3] = mine[0] - mine[1] - mine[2];
        mine[4] = 100.0 * mine[3] / (mine[1] + mine[2]);
        st = mesh_sum(M, v, 5 * n);
    }
    if (st == DT_SUCCESS && M->rank == 0) {
        const char *fmt = "%s: step %.2f ms; matmuls %.2f ms; attention %.2f ms; the rest %.2f ms "
                          "= %.1f%% on top of matmuls + attention\n";
        char who[64];
        snprintf(who, sizeof who, NAME ": profile (rank 0, median of %d)", PROFILE_REPS);
        printf(fmt, who, v[0], v[1], v[2], v[3], v[4]);
        if (n > 1) {
            double mx[5];
            for (int k = 0; k < 5; k++) {
                mx[k] = v[k];
                for (int r = 1; r < n; r++) mx[k] = fmax(mx[k], v[5 * r + k]);
            }
            snprintf(who, sizeof who, NAME ": profile (maximum over %d ranks, each figure)", n);
            printf(fmt, who, mx[0], mx[1], mx[2], mx[3], mx[4]);
        }
        int calls[OP_KINDS] = {0};
        for (int i = 0; i < log->n; i++) calls[log->op[i].kind]++;
        printf(NAME ": profile: a step's calls on each rank:");
        for (int k = 0; k < OP_KINDS; k++)
            printf(" %d %s%s", calls[k], op_names[k], k + 1 < OP_KINDS ? "," : "\n");
        fflush(stdout);
    }
    free(v);
    M->log = NULL;
    for (int i = 0; log && i < log->n; i++)
        for (int k = 0; k < 4; k++) dt_tensor_destroy(log->op[i].arg[k]);
    dt_tensor_destroy(probe);
    free(log);
    return st;
}

/* ------------------------------------------------------------ files */

/* Tensors t[0..n), global and unsharded, written as fp32 by rank 0 to f
 * (collective; f NULL: gathered, not written). */
static dt_status gather_write(dt_tensor *const *t, int count, FILE *f) {
    dt_status st = DT_SUCCESS;
    for (int i = 0; i < count && st == DT_SUCCESS; i++) {
        dt_tensor *full = NULL;
        st = dt_tensor_gather(t[i], 0, &full);
        if (st == DT_SUCCESS && full && f) {
            const size_t n = (size_t)dt_tensor_local_numel(full);
            void *raw = malloc(dt_tensor_local_bytes(full) + 1);
            float *v = malloc(n * sizeof *v + 1);
            st = raw && v ? dt_tensor_get_local(full, raw, dt_tensor_local_bytes(full))
                          : dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
            if (st == DT_SUCCESS) {
                dt_values_get(raw, dt_tensor_dtype(full), n, v);
                if (fwrite(v, sizeof *v, n, f) != n)
                    st = dt_error(DT_ERR_SYSTEM, "writing parameters: %s", strerror(errno));
            }
            free(raw);
            free(v);
        }
        dt_tensor_destroy(full);
    }
    return st;
}

/* Every parameter, as gather_write. */
static dt_status gather_params(model *M, FILE *f) {
    dt_tensor *w[MAX_PARAMS];
    for (int i = 0; i < M->np; i++) w[i] = M->p[i].w;
    return gather_write(w, M->np, f);
}

static dt_status make_dir(const char *dir) {
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) return DT_SUCCESS;
    return dt_error(DT_ERR_SYSTEM, "cannot make directory %s: %s", dir, strerror(errno));
}

static FILE *open_in(const char *dir, const char *name, const char *mode) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fopen(path, mode);
}

/* --dump: config.txt and params.txt (rank 0), and the initial parameters. */
static dt_status dump_begin(model *M) {
    const config *c = M->c;
    dt_status st = DT_SUCCESS;
    FILE *f = NULL;
    if (M->rank == 0) {
        DT_TRY(make_dir(c->dump));
        f = open_in(c->dump, "config.txt", "w");
        if (!f) return dt_error(DT_ERR_SYSTEM, "cannot write %s/config.txt", c->dump);
        fprintf(f, "vocab %d\nlayers %lld\ndim %lld\nheads %lld\nkv_heads %lld\nffn %lld\nseq %lld\n"
                   "batch %lld\nsteps %lld\nlr %.9g\nbeta1 %.9g\nbeta2 %.9g\neps %.9g\n"
                   "weight_decay %.9g\nclip %.9g\nrope_base %.9g\nnorm_eps %.9g\n",
                VOCAB, (long long)c->layers, (long long)c->dim, (long long)c->heads,
                (long long)c->kv_heads, (long long)c->ffn, (long long)c->seq, (long long)c->batch,
                (long long)c->steps, (double)c->lr, (double)c->beta1, (double)c->beta2,
                (double)c->eps, (double)c->weight_decay, (double)c->clip, (double)ROPE_BASE,
                (double)NORM_EPS);
        if (c->packed) fprintf(f, "packed 1\n");
        fclose(f);
        if (c->packed) {
            f = open_in(c->dump, "separator.bin", "wb");
            if (!f || fwrite(c->sep, 1, (size_t)c->sep_len, f) != (size_t)c->sep_len) {
                if (f) fclose(f);
                return dt_error(DT_ERR_SYSTEM, "cannot write %s/separator.bin", c->dump);
            }
            fclose(f);
        }
        f = open_in(c->dump, "params.txt", "w");
        if (!f) return dt_error(DT_ERR_SYSTEM, "cannot write %s/params.txt", c->dump);
        for (int i = 0; i < M->np; i++) {
            fprintf(f, "%s %lld", M->p[i].name, (long long)M->p[i].shape[0]);
            if (M->p[i].ndim == 2) fprintf(f, " %lld", (long long)M->p[i].shape[1]);
            fprintf(f, "\n");
        }
        fclose(f);
        f = open_in(c->dump, "init.bin", "wb");
        if (!f) st = dt_error(DT_ERR_SYSTEM, "cannot write %s/init.bin", c->dump);
    }
    /* every rank joins the gathers, also when rank 0 could not open the file */
    dt_status g = gather_params(M, f);
    if (f) fclose(f);
    return st != DT_SUCCESS ? st : g;
}

static dt_status dump_end(model *M) {
    FILE *f = M->rank == 0 ? open_in(M->c->dump, "final.bin", "wb") : NULL;
    dt_status st = M->rank == 0 && !f ? dt_error(DT_ERR_SYSTEM, "cannot write final.bin") : DT_SUCCESS;
    dt_status g = gather_params(M, f);
    if (f) fclose(f);
    return st != DT_SUCCESS ? st : g;
}

/* --export FILE: the parameters in the safetensors format (a little-endian
 * u64 header length, the JSON header, the data), in their dtype. */
static dt_status export_safetensors(model *M, const char *path) {
    dt_tensor *full[MAX_PARAMS] = {0};
    dt_status st = DT_SUCCESS;
    for (int i = 0; i < M->np && st == DT_SUCCESS; i++) st = dt_tensor_gather(M->p[i].w, 0, &full[i]);
    if (st == DT_SUCCESS && M->rank == 0) {
        static const char *const names[] = {"F32", "BF16", "F16"};
        const dt_dtype dt = M->c->dtype;
        const char *dname = names[dt == DT_F32 ? 0 : dt == DT_BF16 ? 1 : 2];
        size_t cap = 256 + (size_t)M->np * 128, len = 0, off = 0;
        char *h = malloc(cap);
        if (!h) st = dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
        if (h) len += (size_t)snprintf(h + len, cap - len, "{");
        for (int i = 0; h && i < M->np; i++) {
            const size_t bytes = dt_tensor_local_bytes(full[i]);
            len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld",
                                    i ? "," : "", M->p[i].name, dname, (long long)M->p[i].shape[0]);
            if (M->p[i].ndim == 2) len += (size_t)snprintf(h + len, cap - len, ",%lld", (long long)M->p[i].shape[1]);
            len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
            off += bytes;
        }
        if (h) {
            len += (size_t)snprintf(h + len, cap - len, "}");
            while (len % 8) h[len++] = ' ';   /* the data starts 8-byte aligned */
        }
        FILE *f = st == DT_SUCCESS ? fopen(path, "wb") : NULL;
        if (st == DT_SUCCESS && !f) st = dt_error(DT_ERR_SYSTEM, "cannot write --export %s: %s", path, strerror(errno));
        if (f) {
            unsigned char n8[8];
            for (int b = 0; b < 8; b++) n8[b] = (unsigned char)((uint64_t)len >> (8 * b));
            int ok = fwrite(n8, 1, 8, f) == 8 && fwrite(h, 1, len, f) == len;
            for (int i = 0; ok && i < M->np; i++) {
                const size_t bytes = dt_tensor_local_bytes(full[i]);
                void *raw = malloc(bytes + 1);
                ok = raw && dt_tensor_get_local(full[i], raw, bytes) == DT_SUCCESS &&
                     fwrite(raw, 1, bytes, f) == bytes;
                free(raw);
            }
            if (fclose(f) != 0 || !ok) st = dt_error(DT_ERR_SYSTEM, "writing --export %s failed", path);
        }
        free(h);
    }
    for (int i = 0; i < M->np; i++) dt_tensor_destroy(full[i]);
    return st;
}

/* ---- checkpoints: DIR/manifest.txt and DIR/rank-R.bin (each rank's local
 * buffers, in the manifest's order: per parameter its value, then the
 * fp32 master if the dtype is not fp32, then AdamW's m and v). */

enum { K_PARAM, K_MASTER, K_M, K_V, K_COUNT };
static const char *const kind_names[K_COUNT] = {"param", "master", "m", "v"};

static dt_tensor *kind_of(param *p, int k) {
    return k == K_PARAM ? p->w : k == K_MASTER ? p->master : k == K_M ? p->m : p->v;
}

static dt_status checkpoint_save(model *M, const char *dir, int64_t next_step) {
    const config *c = M->c;
    DT_TRY(make_dir(dir));
    char name[64];
    snprintf(name, sizeof name, "rank-%d.bin", M->rank);
    FILE *f = open_in(dir, name, "wb");
    if (!f) return dt_error(DT_ERR_SYSTEM, "cannot write %s/%s: %s", dir, name, strerror(errno));
    FILE *man = M->rank == 0 ? open_in(dir, "manifest.txt.tmp", "w") : NULL;
    if (M->rank == 0 && !man) {
        fclose(f);
        return dt_error(DT_ERR_SYSTEM, "cannot write %s/manifest.txt.tmp", dir);
    }
    if (man)
        fprintf(man, "dtensor-checkpoint 2\nstep %lld\nseed %llu\nmesh %d %d %d\nsp %d\ndtype %s\n"
                     "model %d %lld %lld %lld %lld %lld\n", (long long)next_step,
                (unsigned long long)c->seed, c->dp, c->tp, c->cp, c->sp, dt_dtype_name(c->dtype),
                VOCAB, (long long)c->layers, (long long)c->dim, (long long)c->heads,
                (long long)c->kv_heads, (long long)c->ffn);
    dt_status st = DT_SUCCESS;
    size_t off = 0;
    for (int i = 0; i < M->np && st == DT_SUCCESS; i++)
        for (int k = 0; k < K_COUNT && st == DT_SUCCESS; k++) {
            dt_tensor *t = kind_of(&M->p[i], k);
            if (!t) continue;
            const size_t bytes = dt_tensor_local_bytes(t);
            void *h = malloc(bytes + 1);
            st = h ? dt_tensor_get_local(t, h, bytes) : dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
            if (st == DT_SUCCESS && fwrite(h, 1, bytes, f) != bytes)
                st = dt_error(DT_ERR_SYSTEM, "writing %s/%s: %s", dir, name, strerror(errno));
            free(h);
            if (man)
                fprintf(man, "tensor %s %s %s %lld %lld %s %zu\n", M->p[i].name, kind_names[k],
                        dt_dtype_name(dt_tensor_dtype(t)), (long long)M->p[i].shape[0],
                        (long long)(M->p[i].ndim == 2 ? M->p[i].shape[1] : 0),
                        M->p[i].tp_dim < 0 ? "R" : M->p[i].tp_dim == 0 ? "S0" : "S1", off);
            off += bytes;
        }
    if (fclose(f) != 0 && st == DT_SUCCESS) st = dt_error(DT_ERR_SYSTEM, "writing %s/%s", dir, name);
    if (man) {
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/manifest.txt.tmp", dir);
        snprintf(b, sizeof b, "%s/manifest.txt", dir);
        if (fclose(man) != 0 || (st == DT_SUCCESS && rename(a, b) != 0))
            st = st != DT_SUCCESS ? st : dt_error(DT_ERR_SYSTEM, "writing %s", b);
    }
    return st;
}

/* Reads `bytes` at `off` of DIR/rank-R.bin into buf. */
static dt_status read_part(const char *dir, int rank, size_t off, void *buf, size_t bytes) {
    char name[64];
    snprintf(name, sizeof name, "rank-%d.bin", rank);
    FILE *f = open_in(dir, name, "rb");
    if (!f) return dt_error(DT_ERR_INVALID_ARGUMENT, "--resume: cannot open %s/%s", dir, name);
    const int ok = fseek(f, (long)off, SEEK_SET) == 0 && fread(buf, 1, bytes, f) == bytes;
    fclose(f);
    return ok ? DT_SUCCESS : dt_error(DT_ERR_INVALID_ARGUMENT, "--resume: %s/%s is too short", dir, name);
}

/* One saved tensor, made whole on the host from the shards it needs: on the
 * saved mesh the shards differ only over tp (parameters are Replicate over
 * dp and cp), so the ranks at dp = cp = 0 hold them all. */
static dt_status read_whole(const char *dir, int version, const int *mesh, const param *p,
                            int tp_dim, size_t esize, size_t off, void *full) {
    const int tp = tp_dim < 0 ? 1 : mesh[1];
    const int64_t rows = p->shape[0], cols = p->ndim == 2 ? p->shape[1] : 1;
    const int64_t lr = tp_dim == 0 ? rows / tp : rows, lc = tp_dim == 1 ? cols / tp : cols;
    char *buf = malloc((size_t)(lr * lc) * esize + 1);
    if (!buf) return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    dt_status st = DT_SUCCESS;
    for (int j = 0; j < tp && st == DT_SUCCESS; j++) {
        /* dp 0, tp j, cp 0: the mesh (dp, cp, tp) has tp fastest; version 1
         * checkpoints were written on (dp, tp, cp) */
        const int rank = version == 1 ? j * mesh[2] : j;
        st = read_part(dir, rank, off, buf, (size_t)(lr * lc) * esize);
        for (int64_t r = 0; st == DT_SUCCESS && r < lr; r++) {
            const int64_t gr = tp_dim == 0 ? j * lr + r : r, gc = tp_dim == 1 ? j * lc : 0;
            memcpy((char *)full + (size_t)(gr * cols + gc) * esize, buf + (size_t)(r * lc) * esize,
                   (size_t)lc * esize);
        }
    }
    free(buf);
    return st;
}

/* --resume: the manifest must describe this model; the mesh may differ. */
static dt_status checkpoint_load(model *M, const char *dir, int64_t *step) {
    const config *c = M->c;
    FILE *man = open_in(dir, "manifest.txt", "r");
    if (!man) return dt_error(DT_ERR_INVALID_ARGUMENT, "--resume: no %s/manifest.txt", dir);
    int version = 0, mesh[3] = {0}, sp = 0, vocab = 0;
    long long s = 0, L = 0, d = 0, H = 0, Hkv = 0, F = 0;
    unsigned long long seed = 0;
    char dtype[16] = "";
    int ok = fscanf(man, "dtensor-checkpoint %d step %lld seed %llu mesh %d %d %d sp %d dtype %15s "
                         "model %d %lld %lld %lld %lld %lld", &version, &s, &seed, &mesh[0], &mesh[1],
                    &mesh[2], &sp, dtype, &vocab, &L, &d, &H, &Hkv, &F) == 14;
    dt_status st = DT_SUCCESS;
    if (!ok || (version != 1 && version != 2))
        st = dt_error(DT_ERR_INVALID_ARGUMENT, "--resume: %s/manifest.txt is not a version 1 or 2 "
                      "checkpoint", dir);
    else if (vocab != VOCAB || L != c->layers || d != c->dim || H != c->heads || Hkv != c->kv_heads ||
             F != c->ffn || strcmp(dtype, dt_dtype_name(c->dtype)))
        st = dt_error(DT_ERR_INVALID_ARGUMENT, "--resume: the checkpoint's model (layers %lld dim %lld "
                      "heads %lld kv-heads %lld ffn %lld, %s) is not this run's", L, d, H, Hkv, F, dtype);
    else if (seed != c->seed)
        st = dt_error(DT_ERR_INVALID_ARGUMENT, "--resume: the checkpoint was trained with --seed %llu "
                      "(the data positions follow it)", seed);
    /* a rank reads its own file where it holds what it wrote (version 1:
     * ranks numbered on (dp, tp, cp), the same where tp or cp is 1) */
    const int same_mesh = mesh[0] == c->dp && mesh[1] == c->tp && mesh[2] == c->cp &&
                          (version == 2 || c->tp == 1 || c->cp == 1);
    while (st == DT_SUCCESS) {
        char name[48], kind[16], dt[16], pl[8];
        long long s0, s1;
        size_t off;
        const int n = fscanf(man, " tensor %47s %15s %15s %lld %lld %7s %zu", name, kind, dt, &s0, &s1,
                             pl, &off);
        if (n == EOF) break;
        if (n != 7) {
            st = dt_error(DT_ERR_INVALID_ARGUMENT, "--resume: bad tensor line in the manifest");
            break;
        }
        int i = 0, k = 0;
        while (i < M->np && strcmp(M->p[i].name, name)) i++;
        while (k < K_COUNT && strcmp(kind_names[k], kind)) k++;
        if (i == M->np || k == K_COUNT || !kind_of(&M->p[i], k)) {
            st = dt_error(DT_ERR_INVALID_ARGUMENT, "--resume: the manifest's %s %s is not this "
                          "model's", name, kind);
            break;
        }
        dt_tensor *t = kind_of(&M->p[i], k);
        const size_t es = dt_dtype_size(dt_tensor_dtype(t));
        if (same_mesh) {   /* this rank's own shard */
            const size_t bytes = dt_tensor_local_bytes(t);
            void *h = malloc(bytes + 1);
            st = h ? read_part(dir, M->rank, off, h, bytes) : dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
            if (st == DT_SUCCESS) st = dt_tensor_set_local(t, h, bytes);
            free(h);
        } else {           /* whole from the shards that differ, then this rank's part */
            const int tp_dim = pl[0] == 'R' ? -1 : pl[1] - '0';
            void *full = malloc((size_t)param_numel(&M->p[i]) * es + 1);
            st = full ? read_whole(dir, version, mesh, &M->p[i], tp_dim, es, off, full)
                      : dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
            if (st == DT_SUCCESS) st = dt_tensor_set_global(t, full);
            free(full);
        }
    }
    fclose(man);
    *step = s;
    return st;
}

/* ------------------------------------------------------------ sampling */

/* Greedy: each next byte is the argmax of the logits at the last position
 * of a forward pass over the text so far (its last S bytes, padded after
 * the end: causal, so the padding is never seen). dp identical rows. */
static dt_status sample(model *M, const corpus *d, char *out, int64_t n_out) {
    const config *c = M->c;
    const int64_t S = c->seq, B = c->dp;
    char prompt[256];
    size_t plen = 0;
    if (c->prompt) {
        plen = strlen(c->prompt) < sizeof prompt - 1 ? strlen(c->prompt) : sizeof prompt - 1;
        memcpy(prompt, c->prompt, plen);
    } else {   /* the corpus's first line */
        while (plen < sizeof prompt - 1 && (int64_t)plen < d->n && d->bytes[plen] != '\n') plen++;
        memcpy(prompt, d->bytes, plen);
        if ((int64_t)plen < d->n && plen < sizeof prompt - 1) prompt[plen++] = '\n';
    }
    const int64_t total = (int64_t)plen + n_out;
    unsigned char *text = malloc((size_t)total + 1);
    int32_t *seq = malloc((size_t)(B * (S + 1)) * sizeof *seq);
    float *logits = malloc((size_t)(B * S * VOCAB) * sizeof *logits);
    if (!text || !seq || !logits) {
        free(text), free(seq), free(logits);
        return dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    memcpy(text, prompt, plen);
    dt_status st = DT_SUCCESS;
    for (int64_t len = (int64_t)plen; len < total && st == DT_SUCCESS; len++) {
        const int64_t from = len > S ? len - S : 0, n = len - from;
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t <= S; t++) seq[b * (S + 1) + t] = t < n ? text[from + t] : ' ';
        dt_tensor *x = NULL, *h = NULL, *nn = NULL, *nf = NULL, *lg = NULL, *lr = NULL;
        st = batch_tensors(M, B, seq, &x, NULL);
        if (st == DT_SUCCESS) st = embed(M, x, &h);
        for (int i = 0; i < c->layers && st == DT_SUCCESS; i++) {
            cache cc;
            memset(&cc, 0, sizeof cc);
            cc.h = h;
            dt_tensor *next = NULL;
            st = layer_forward(M, i, &cc, &next);
            cache_drop(&cc);
            dt_tensor_destroy(h);
            h = next;
        }
        if (st == DT_SUCCESS) st = head_forward(M, h, &nn, &nf, &lg);
        if (st == DT_SUCCESS) st = dt_tensor_replicate(lg, &lr);
        if (st == DT_SUCCESS) {
            const size_t bytes = dt_tensor_local_bytes(lr);
            void *raw = malloc(bytes + 1);
            st = raw ? dt_tensor_get_local(lr, raw, bytes) : dt_error(DT_ERR_OUT_OF_MEMORY, "out of memory");
            if (st == DT_SUCCESS) dt_values_get(raw, c->dtype, (size_t)(B * S * VOCAB), logits);
            free(raw);
        }
        if (st == DT_SUCCESS) {
            const float *row = logits + (n - 1) * VOCAB;   /* batch row 0, the last position */
            int best = 0;
            for (int v = 1; v < VOCAB; v++) best = row[v] > row[best] ? v : best;
            text[len] = (unsigned char)best;
        }
        dt_tensor *all[] = {x, h, nn, nf, lg, lr};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) dt_tensor_destroy(all[k]);
    }
    for (int64_t i = 0; i < total; i++) out[i] = isprint(text[i]) || text[i] == '\n' ? (char)text[i] : '?';
    out[total] = '\0';
    free(text), free(seq), free(logits);
    return st;
}

/* ------------------------------------------------------------ the run */

/* --comm-counts: the communicators of dp, tp and cp, then the world's;
 * their counters bracket the first step. */
#define STEP_COMMS 4
static const char *const step_comm_names[STEP_COMMS] = {"dp", "tp", "cp", "world"};
static dt_comm *step_comm(const model *M, int i) {
    static const int mesh_dim[3] = {MESH_DP, MESH_TP, MESH_CP};
    return i < 3 ? dt_mesh_comm(M->mesh, mesh_dim[i]) : dt_context_comm(M->ctx);
}

/* Rank 0 prints a line per communicator and kind with calls since the reset. */
static dt_status print_comm_counts(const model *M) {
    for (int i = 0; i < STEP_COMMS && M->rank == 0; i++) {
        dt_comm_counters k;
        DT_TRY(dt_comm_counters_get(step_comm(M, i), &k));
        for (int j = 0; j < DT_COMM_KIND_COUNT; j++)
            if (k.calls[j])
                printf("comm %s %s calls %llu sent %llu recv %llu\n", step_comm_names[i],
                       dt_comm_kind_name((dt_comm_kind)j), (unsigned long long)k.calls[j],
                       (unsigned long long)k.bytes_sent[j], (unsigned long long)k.bytes_recv[j]);
    }
    if (M->rank == 0) fflush(stdout);
    return DT_SUCCESS;
}

typedef struct run {
    const config *cfg;
    int status;   /* the exit status rank 0 decides on */
} run;

static dt_status train(dt_context *ctx, void *arg) {
    run *R = arg;
    const config *c = R->cfg;
    model M;
    memset(&M, 0, sizeof M);
    M.c = c;
    M.ctx = ctx;
    M.rank = dt_context_rank(ctx);
    M.world = dt_context_world_size(ctx);
    const int sizes[3] = {[MESH_DP] = c->dp, [MESH_CP] = c->cp, [MESH_TP] = c->tp};
    const char *const names[3] = {[MESH_DP] = "dp", [MESH_CP] = "cp", [MESH_TP] = "tp"};
    corpus d = {NULL, 0};
    float *losses = NULL;
    int32_t *seq = NULL;
    FILE *loss_f = NULL, *tok_f = NULL;
    dt_tensor *x = NULL, *y = NULL;
    char *text = NULL;
    int64_t start = 0;
    dt_status st;
    DT_TRY_GOTO(st, dt_mesh_create(ctx, 3, sizes, names, &M.mesh), out);
    model_table(&M);
    DT_TRY_GOTO(st, model_create(&M), out);
    if (c->resume) DT_TRY_GOTO(st, checkpoint_load(&M, c->resume, &start), out);
    DT_TRY_GOTO(st, corpus_read(c->data, &d), out);
    if (d.n < c->seq + 2)
        DT_TRY_GOTO(st, dt_error(DT_ERR_INVALID_ARGUMENT, "the data has %lld bytes, fewer than "
                                 "--seq + 2", (long long)d.n), out);
    double peak = c->peak_tflops;
    if (peak <= 0) DT_TRY_GOTO(st, measure_peak(&M, &peak), out);
    const double fpt = flops_per_token(&M);
    int64_t nparams = 0;
    for (int i = 0; i < M.np; i++) nparams += param_numel(&M.p[i]);
    if (M.rank == 0) {
        printf(NAME ": %d ranks (dp %d x tp %d x cp %d, %s%s), %s on %s; %lld layers, dim %lld, "
               "heads %lld/%lld, ffn %lld: %.3f M parameters\n", M.world, c->dp, c->tp, c->cp,
               dt_order_name(c->order), c->sp ? ", sp" : "", dt_dtype_name(c->dtype),
               dt_backend_kind_name(dt_context_backend(ctx)), (long long)c->layers,
               (long long)c->dim, (long long)c->heads, (long long)c->kv_heads, (long long)c->ffn,
               (double)nparams / 1e6);
        printf(NAME ": %lld sequences of %lld bytes a step, steps %lld to %lld; MFU against %.4g "
               "TFLOPS (%s)\n", (long long)c->batch, (long long)c->seq, (long long)start,
               (long long)c->steps - 1, peak, c->peak_tflops > 0 ? "--peak-tflops" : "measured");
        fflush(stdout);
    }
    if (c->dump) {
        DT_TRY_GOTO(st, dump_begin(&M), out);
        if (M.rank == 0) {
            loss_f = open_in(c->dump, "loss.txt", "w");
            tok_f = open_in(c->dump, "tokens.bin", "wb");
            if (!loss_f || !tok_f)
                DT_TRY_GOTO(st, dt_error(DT_ERR_SYSTEM, "cannot write %s/loss.txt", c->dump), out);
        }
    }
    const int64_t n_steps = c->steps > start ? c->steps - start : 0;
    losses = malloc((size_t)(n_steps + 1) * sizeof *losses);
    seq = malloc((size_t)(c->batch * (c->seq + 1)) * sizeof *seq);
    if (!losses || !seq) DT_TRY_GOTO(st, dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory"), out);
    const double t_start = ex_now_s();
    double t_last = t_start, rss_first = -1.0;
    dt_memory_stats mem_first = {0, 0, 0, 0};
    int64_t logged = start - 1;   /* the step of the last line */
    for (int64_t s = start; s < c->steps; s++) {
        batch_tokens(c, &d, s, seq);
        if (tok_f) fwrite(seq, sizeof *seq, (size_t)(c->batch * (c->seq + 1)), tok_f);
        float loss = NAN;
        double norm = 0.0;
        const float lr = lr_at(c, s);
        DT_TRY_GOTO(st, batch_tensors(&M, c->batch, seq, &x, &y), out);
        const int counting = c->comm_counts && s == start;
        for (int i = 0; counting && i < STEP_COMMS; i++) dt_comm_counters_reset(step_comm(&M, i));
        DT_TRY_GOTO(st, forward_backward(&M, x, y, &loss), out);
        const int dump_grads = c->dump && s == start;   /* the first step's, grad0.bin */
        FILE *grads = dump_grads && M.rank == 0 ? open_in(c->dump, "grad0.bin", "wb") : NULL;
        st = optimizer_step(&M, s, lr, dump_grads, grads, &norm);
        if (grads) fclose(grads);
        if (st != DT_SUCCESS) goto out;
        if (counting) DT_TRY_GOTO(st, print_comm_counts(&M), out);
        dt_tensor_destroy(x), dt_tensor_destroy(y);
        x = y = NULL;
        if (s == start) {
            DT_TRY_GOTO(st, dt_context_memory(ctx, &mem_first), out);
            rss_first = rss_kib();
        }
        losses[s - start] = loss;
        if (loss_f) fprintf(loss_f, "%lld %.9g %.9g %.9g\n", (long long)s, (double)loss, norm, (double)lr);
        const int last = s + 1 == c->steps;
        if (M.rank == 0 && ((s - start) % c->log_every == 0 || last)) {
            const double now = ex_now_s(), dt_s = now - t_last;
            const int64_t done = s - start + 1, k = s - logged;   /* steps since the last line */
            logged = s;
            const double tps = dt_s > 0 ? (double)(k * c->batch * c->seq) / dt_s : 0.0;
            const double eta = (now - t_start) / (double)done * (double)(c->steps - 1 - s);
            printf("step %5lld/%lld | loss %.4f | grad norm %7.4f | lr %.2e | %8.0f tok/s | MFU "
                   "%5.2f%% | %.0f s, %.0f s left\n", (long long)s, (long long)c->steps,
                   (double)loss, norm, (double)lr, tps, 100.0 * tps * fpt / (peak * 1e12),
                   now - t_start, eta);
            fflush(stdout);
            t_last = now;
        }
        if (c->save && c->save_every && (s + 1) % c->save_every == 0 && !last)
            DT_TRY_GOTO(st, checkpoint_save(&M, c->save, s + 1), out);
    }
    if (n_steps > 0) DT_TRY_GOTO(st, report_memory(&M, &mem_first, rss_first), out);
    if (c->save) DT_TRY_GOTO(st, checkpoint_save(&M, c->save, c->steps > start ? c->steps : start), out);
    if (c->dump) DT_TRY_GOTO(st, dump_end(&M), out);
    if (c->export_path) DT_TRY_GOTO(st, export_safetensors(&M, c->export_path), out);
    if (c->svg && M.rank == 0 && n_steps > 0) write_svg(c->svg, losses, start, n_steps);
    if (c->sample_chars > 0) {
        text = malloc((size_t)c->sample_chars + 300);
        if (!text) DT_TRY_GOTO(st, dt_error(DT_ERR_OUT_OF_MEMORY, "out of host memory"), out);
        DT_TRY_GOTO(st, sample(&M, &d, text, c->sample_chars), out);
        if (M.rank == 0) printf(NAME ": sampled greedily after training:\n%s\n", text);
    }
    if (c->profile) {   /* last: it steps the parameters */
        batch_tokens(c, &d, c->steps, seq);
        DT_TRY_GOTO(st, batch_tensors(&M, c->batch, seq, &x, &y), out);
        DT_TRY_GOTO(st, profile(&M, x, y, c->steps), out);
    }
    if (M.rank == 0 && n_steps > 0)
        printf(NAME ": loss %.4f at step %lld -> %.4f at step %lld\n", (double)losses[0],
               (long long)start, (double)losses[n_steps - 1], (long long)c->steps - 1);
    if (M.rank == 0)
        printf("next: build/examples/striped_attention   Ring, Striped and Zigzag attention, checked, "
               "with each order's work\n"
               "next: build/examples/tensor_parallel_mlp  a column- then row-parallel MLP\n"
               "next: build/examples/transformer_block    one block on a tp x sp mesh, checked\n");
out:
    if (loss_f) fclose(loss_f);
    if (tok_f) fclose(tok_f);
    dt_tensor_destroy(x), dt_tensor_destroy(y);
    model_destroy(&M);
    dt_mesh_destroy(M.mesh);
    free(d.bytes), free(losses), free(seq), free(text);
    return st;
}

/* The shipped corpus: from the working directory, else from the source tree
 * of this binary (build/examples/train_gpt -> examples/data/). */
static const char *default_data(const char *argv0, char *buf, size_t size) {
    static const char *const rel = "examples/data/tinyshakespeare.txt";
    const char *slash = strrchr(argv0, '/');
    if (access(rel, R_OK) == 0 || !slash) return rel;
    snprintf(buf, size, "%.*s/../../%s", (int)(slash - argv0), argv0, rel);
    return access(buf, R_OK) == 0 ? buf : rel;
}

int main(int argc, char **argv) {
    config c;
    const int p = parse_args(argc, argv, &c);
    if (p) return p == 1 ? 0 : 2;
    char data[4096];
    if (!c.data) c.data = default_data(argv[0], data, sizeof data);
    dt_launch_options o = DT_LAUNCH_OPTIONS_INIT;
    o.backend = c.backend;
    run r = {&c, 0};
    dt_status st = dt_launch(c.ranks, train, &r, &o);
    dt_status fin = dt_finalize();
    if (st != DT_SUCCESS) {
        fprintf(stderr, NAME ": %s: %s\n", dt_status_name(st), dt_last_error());
        return st == DT_ERR_NOT_SUPPORTED && c.backend == DT_BACKEND_CUDA ? 3 : 1;
    }
    if (fin != DT_SUCCESS) fprintf(stderr, NAME ": %s\n", dt_last_error());
    return 0;
}
