#!/usr/bin/env python3
"""scripts/check_dump.py — replays a `train_gpt --dump DIR` run in PyTorch,
from DIR's files only, and compares it with what the run recorded.

    python3 scripts/check_dump.py DIR [--dtype float64|float32]
                                      [--run-dtype auto|fp32|bf16|fp16] [-v]

The model is the one of examples/train_gpt.c's top comment, built here from
that specification alone in PyTorch's idioms, with y = x @ W (W [in, out]):
  h = tok_emb[x]; per layer: a = rmsnorm(h, attn_norm); q, k, v = a @ wq,
  a @ wk, a @ wv as [B, S, H|Hkv, Dh]; rotary "half" on q and k (pairs i and
  i + Dh/2 at angle p * rope_base^(-2i/Dh), p the position in the sequence);
  causal attention, scale 1/sqrt(Dh), query head j reading kv head
  j // (H/Hkv); h += o @ wo; m = rmsnorm(h, mlp_norm);
  h += (silu(m @ w_gate) * (m @ w_up)) @ w_down; logits = rmsnorm(h, norm) @
  lm_head; loss = mean cross-entropy. rmsnorm(x, w) = x / sqrt(mean(x^2) +
  norm_eps) * w.
From DIR's files only:
  params.txt / init.bin   the parameters, in order, global, fp32 row-major
  config.txt              the hyperparameters
  tokens.bin              int32 [steps, batch, seq + 1]: inputs [:, :-1],
                          targets [:, 1:]
  loss.txt                per step `step loss grad_norm lr`; the lr column is
                          the schedule (train_gpt's config.txt does not name
                          --warmup or --cosine; loss.txt records each step's lr)
  separator.bin           with `packed 1` in config.txt (train_gpt --packed):
                          the separator; a document ends after each one in a
                          row of inputs, attends only itself, and its rotary
                          positions restart at 0
Each step: forward, F.cross_entropy (mean), backward, the global L2 norm and
clip_grad_norm_(max_norm=clip), torch.optim.AdamW with two groups (weight
decay on parameters of two or more dims, none on the norms).

Clipping: train_gpt scales the gradients by clip / (norm + 1e-6) when that
is below 1; torch.nn.utils.clip_grad_norm_ computes
clamp(max_norm / (total_norm + 1e-6), max=1) and multiplies by it, the same
rule. train_gpt with --clip 0 does not clip (max_norm 0 would zero every
gradient in PyTorch), so clip <= 0 only measures the norm here.

Compared: each step's loss and gradient norm (loss.txt), the first step's
gradients (grad0.bin), the final parameters (final.bin). The replay runs
twice, in float64 (the reference, or float32 with --dtype float32) and in
float32: how far the float32 replay strays from the float64 one is the
fp32 noise that this run's dynamics amplify, and bounds the later steps of
an fp32 run. The tolerances (TOLERANCES below) are those of the dumped
run's arithmetic against an exact replay; a float32 reference adds its own
error of the same size, so they are doubled with --dtype float32. The run's
dtype: config.txt's `dtype` when it has one, else read from init.bin (every
value a bf16, or an fp16: the parameters are stored in that dtype).

A resumed run's dump (loss.txt not starting at step 0) cannot be replayed:
AdamW's moments at the resume point are not in it.

Exit status: 0 every comparison within tolerance, 1 some are not, 2 the
files are missing, malformed or inconsistent. Covered by tests/test_train.c
(test_dump_replays_in_pytorch), which skips without PyTorch.
"""
import argparse
import math
import os
import sys

try:   # main() says how to install them when missing
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    np = torch = F = None
    MISSING = e

CONFIG_KEYS = ("vocab", "layers", "dim", "heads", "kv_heads", "ffn", "seq", "batch", "steps",
               "lr", "beta1", "beta2", "eps", "weight_decay", "clip", "rope_base", "norm_eps")
INT_KEYS = ("vocab", "layers", "dim", "heads", "kv_heads", "ffn", "seq", "batch", "steps")
# keys config.txt may add: the run's dtype (fp32|bf16|fp16; else read from
# init.bin), the lr schedule (replayed from loss.txt's lr column either way)
# and packed 1 (documents packed in each sequence, see doc_starts)
OPTIONAL_KEYS = ("dtype", "warmup", "cosine", "min_lr", "packed")

# Tolerances of a run in each dtype against an exact (float64) replay, per
# item, as |got - ref| <= rtol |ref| + atol.
#   step 0     one forward and backward from the same parameters, so its
#              loss, norm and gradients carry only that pass's rounding.
#              fp32: the loss is a mean of B*S log-softmax terms through dot
#              products of at most max(d, F) terms, each with a relative error
#              of some tens of unit roundoffs (6e-8): 1e-5 leaves a margin.
#              Gradients: relative 1e-3 plus 1e-5 of the largest, since an
#              element that is mostly cancellation (the query and key
#              projections at initialisation, whose attention is near
#              uniform) is only known to the rounding of the sums it cancels
#              from.
#   later      each step starts from parameters that already differ: AdamW
#              divides each gradient by its own running magnitude, so an
#              element whose gradient is mostly rounding noise moves by an
#              amount that follows the noise, and a clipped spike's height
#              follows it too; a training run amplifies rounding. fp32: the
#              later losses and norms must be within the larger of the step-0
#              bound (loss) or ten times it (norm), and twice the furthest
#              PyTorch's own float32 replay strays from the float64 one on
#              this trajectory (both replays run; that drift is the fp32
#              noise the dynamics make of the same data).
#   params     the final parameters: an element moves at most about lr a step
#              (AdamW's reach, the sum of the steps' lr), so all but
#              param_loose of them must agree within param_rtol |w| plus
#              param_reach of that reach, and every one within twice it.
# bf16 and fp16 store parameters and activations in 16 bits (unit roundoff
# 2^-8 and 2^-11; master weights and moments in fp32): each matmul's output
# carries a few units, so step 0's loss agrees to about one unit and its
# gradients to a few units of the largest. Later steps: the losses within
# 3% (bf16) or 1% (fp16), tests/test_train.c's bound for bf16 against fp32;
# later norms are reported, not checked (a spike's height follows 16-bit
# noise by tens of percent). init.bin holds the parameters rounded to the
# dtype while the run's masters start unrounded, and final.bin is the master
# rounded again: two units of |w|; many gradient elements are rounding noise,
# so all but one in 1,000 within half of AdamW's reach.
TOLERANCES = {
    "fp32": dict(loss0=1e-5, norm0=1e-5, loss=1e-5, norm=1e-4, grad_rtol=1e-3, grad_atol=1e-5,
                 param_rtol=1e-4, param_reach=0.01, param_loose=1e-4),
    "bf16": dict(loss0=5e-3, norm0=1e-2, loss=3e-2, norm=None, grad_rtol=5e-2, grad_atol=1e-2,
                 param_rtol=2.0 ** -7, param_reach=0.5, param_loose=1e-3),
    "fp16": dict(loss0=1e-3, norm0=2e-3, loss=1e-2, norm=None, grad_rtol=1e-2, grad_atol=2e-3,
                 param_rtol=2.0 ** -10, param_reach=0.5, param_loose=1e-3),
}


class DumpError(Exception):
    """The dump's files are missing, malformed or inconsistent (exit 2)."""


def read_config(d):
    path = os.path.join(d, "config.txt")
    cfg = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2:
                raise DumpError(f"{path}:{n}: expected `key value`, got {line.strip()!r}")
            cfg[parts[0]] = parts[1]
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise DumpError(f"{path}: missing {', '.join(missing)}")
    unknown = sorted(set(cfg) - set(CONFIG_KEYS) - set(OPTIONAL_KEYS))
    if unknown:   # e.g. a schedule or an option this replay does not model
        raise DumpError(f"{path}: keys this replay does not know: {', '.join(unknown)}")
    if cfg.get("dtype", "fp32") not in TOLERANCES:
        raise DumpError(f"{path}: dtype {cfg['dtype']}: not fp32, bf16 or fp16")
    return {k: v if k == "dtype" else int(v) if k in INT_KEYS else float(v)
            for k, v in cfg.items()}


def expected_params(c):
    """[(name, shape)] of the model's parameters, in params.txt's order."""
    V, d, H, Hkv, F_ = c["vocab"], c["dim"], c["heads"], c["kv_heads"], c["ffn"]
    Dh = d // H
    out = [("tok_emb", (V, d))]
    for i in range(c["layers"]):
        p = f"layers.{i}."
        out += [(p + "attn_norm", (d,)), (p + "wq", (d, H * Dh)), (p + "wk", (d, Hkv * Dh)),
                (p + "wv", (d, Hkv * Dh)), (p + "wo", (H * Dh, d)), (p + "mlp_norm", (d,)),
                (p + "w_gate", (d, F_)), (p + "w_up", (d, F_)), (p + "w_down", (F_, d))]
    return out + [("norm", (d,)), ("lm_head", (d, V))]


def read_params(d, c):
    path = os.path.join(d, "params.txt")
    with open(path) as f:
        got = [(p[0], tuple(int(x) for x in p[1:])) for p in (line.split() for line in f) if p]
    want = expected_params(c)
    if got != want:
        bad = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise DumpError(f"{path}: entry {bad} is {got[bad] if bad < len(got) else 'missing'}, "
                        f"the model of config.txt has {want[bad] if bad < len(want) else 'none'}")
    return got


def read_f32(d, name, count):
    path = os.path.join(d, name)
    v = np.fromfile(path, dtype="<f4")
    if v.size != count:
        raise DumpError(f"{path}: {v.size} values, the parameters have {count}")
    return v


def read_losses(d):
    path = os.path.join(d, "loss.txt")
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            p = line.split()
            if len(p) != 4:
                raise DumpError(f"{path}:{n}: expected `step loss grad_norm lr`")
            rows.append((int(p[0]), float(p[1]), float(p[2]), float(p[3])))
    if not rows:
        raise DumpError(f"{path}: no steps")
    if rows[0][0] != 0:
        raise DumpError(f"{path}: starts at step {rows[0][0]}: a resumed run, whose AdamW moments "
                        "are not in the dump, cannot be replayed")
    if [r[0] for r in rows] != list(range(len(rows))):
        raise DumpError(f"{path}: steps are not 0, 1, 2, ...")
    return rows


def run_dtype_of(init):
    """The dtype the run stored its parameters in: every value a bf16 (its
    low 16 bits zero), else every value an fp16, else fp32."""
    bits = init.view("<u4")
    if np.all(bits & 0xFFFF == 0):
        return "bf16"
    if np.array_equal(init.astype(np.float16).astype(np.float32), init):
        return "fp16"
    return "fp32"


def flatten(tensors):
    return torch.cat([t.reshape(-1) for t in tensors]).detach().cpu().numpy().astype(np.float64)


def doc_starts(x, sep):
    """start [B, S]: the first position of each token's document in the
    input rows x [B, S]. A document ends after each occurrence of the
    separator (sep, a list of byte values; None: one document a row): the
    token after it starts the next one."""
    B, S = x.shape
    start = torch.zeros(B, S, dtype=torch.long)
    for b in range(B):
        row = x[b].tolist()
        for t in range(1, S):
            ends = sep is not None and t >= len(sep) and row[t - len(sep):t] == sep
            start[b, t] = t if ends else start[b, t - 1]
    return start


class Gpt:
    """The decoder above over params, a list of tensors in params.txt's order;
    sep: the separator of a packed run (each document attends only itself
    and its positions restart at 0), else None."""

    def __init__(self, c, params, dtype, sep=None):
        self.c, self.p, self.sep, self.dtype = c, params, sep, dtype
        self.H, self.Hkv = c["heads"], c["kv_heads"]
        self.Dh = c["dim"] // self.H
        # rotary "half": pairs (i, i + Dh/2) at angle p * base^(-2i/Dh)
        i = torch.arange(self.Dh // 2, dtype=torch.float64)
        self.inv_freq = c["rope_base"] ** (-2.0 * i / self.Dh)
        self.set_positions(torch.arange(c["seq"])[None, :])

    def set_positions(self, pos):   # pos [B or 1, S]: each token's position in its document
        angle = pos.to(torch.float64)[..., None] * self.inv_freq   # [B, S, Dh/2]
        self.cos = angle.cos().to(self.dtype)[:, :, None, :]   # [B, S, 1, Dh/2]
        self.sin = angle.sin().to(self.dtype)[:, :, None, :]

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["norm_eps"]) * w

    def rotary(self, x):   # x [B, S, heads, Dh]
        a, b = x[..., : self.Dh // 2], x[..., self.Dh // 2:]
        return torch.cat((a * self.cos - b * self.sin, a * self.sin + b * self.cos), dim=-1)

    def attention(self, q, k, v, start):   # [B, heads, S, Dh] each, k and v already repeated
        S = q.shape[-2]
        if start is None and hasattr(F, "scaled_dot_product_attention"):   # PyTorch >= 2.0
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # PyTorch 1.13 (Debian 12's), or a packed run: written out; key u is
        # seen from t when start[t] <= u <= t
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.Dh)
        u = torch.arange(S)
        seen = u[None, :] <= u[:, None]   # [S, S]: causal
        if start is not None:
            seen = seen[None] & (u[None, None, :] >= start[:, :, None])   # [B, S, S]
            seen = seen[:, None]   # over the heads
        return torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1) @ v

    def loss(self, tokens):   # tokens [B, S + 1]
        x, y = tokens[:, :-1], tokens[:, 1:]
        B, S = x.shape
        start = None
        if self.sep is not None:
            start = doc_starts(x, self.sep)
            self.set_positions(torch.arange(S)[None, :] - start)
        it = iter(self.p)
        h = F.embedding(x, next(it))
        for _ in range(self.c["layers"]):
            attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down = (next(it) for _ in range(9))
            a = self.rmsnorm(h, attn_norm)
            q = self.rotary((a @ wq).view(B, S, self.H, self.Dh))
            k = self.rotary((a @ wk).view(B, S, self.Hkv, self.Dh))
            v = (a @ wv).view(B, S, self.Hkv, self.Dh)
            # GQA: query head j reads key/value head j // (H / Hkv)
            rep = self.H // self.Hkv
            k, v = (t.transpose(1, 2).repeat_interleave(rep, dim=1) for t in (k, v))
            o = self.attention(q.transpose(1, 2), k, v, start).transpose(1, 2).reshape(B, S, -1)
            h = h + o @ wo
            m = self.rmsnorm(h, mlp_norm)
            h = h + (F.silu(m @ w_gate) * (m @ w_up)) @ w_down
        norm, lm_head = next(it), next(it)
        logits = self.rmsnorm(h, norm) @ lm_head
        return F.cross_entropy(logits.reshape(B * S, -1), y.reshape(B * S))


def relative(diff, ref):
    """diff / |ref|, with |ref| floored at 1e-3 of the item's largest |ref|:
    an element near zero says nothing relative to its own size."""
    floor = max(1e-3 * float(np.abs(ref).max(initial=0.0)), np.finfo(np.float64).tiny)
    return diff / np.maximum(np.abs(ref), floor)


def compare(got, ref, rtol, atol):
    """(every element within rtol |ref| + atol and finite, max |got - ref|,
    max relative difference as relative())."""
    diff = np.abs(got - ref)
    rel = relative(diff, ref)
    ok = bool(np.all(diff <= rtol * np.abs(ref) + atol)) and bool(np.all(np.isfinite(got)))
    return ok, float(diff.max(initial=0.0)), float(rel.max(initial=0.0))


def replay(c, plist, init, tokens, lrs, dtype, sep=None):
    """Trains the model from init in dtype on tokens [steps, B, S + 1] with
    step s at lr lrs[s]; returns float64 numpy arrays: loss and norm [steps]
    (the norm before clipping), grad0 (the first step's gradients) and final
    (the parameters after the last step), both flat in params.txt's order."""
    sizes = [math.prod(s) for _, s in plist]
    offsets = np.cumsum([0] + sizes)
    params = [torch.tensor(init[offsets[i]:offsets[i + 1]].reshape(s), dtype=dtype,
                           requires_grad=True) for i, (_, s) in enumerate(plist)]
    model = Gpt(c, params, dtype, sep)
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": c["weight_decay"]},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
    losses, norms, grad0 = [], [], None
    for s, lr in enumerate(lrs):
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss = model.loss(tokens[s])
        loss.backward()
        if s == 0:
            grad0 = flatten([p.grad for p in params])
        if c["clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm=c["clip"])
        else:   # train_gpt does not clip
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
    return {"loss": np.array(losses), "norm": np.array(norms), "grad0": grad0,
            "final": flatten(params)}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the directory train_gpt --dump wrote")
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                    help="PyTorch's arithmetic (default float64)")
    ap.add_argument("--run-dtype", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                    help="the dumped run's --dtype, for its tolerances (default: from init.bin)")
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per parameter")
    args = ap.parse_args(argv)
    if torch is None:
        print(f"check_dump: {MISSING} (Debian: apt-get install python3-torch, then run this with "
              "the Python it installs into, /usr/bin/python3)", file=sys.stderr)
        return 2

    d = args.dir
    try:
        c = read_config(d)
        if c["dim"] % c["heads"] or c["heads"] % c["kv_heads"] or (c["dim"] // c["heads"]) % 2:
            raise DumpError("config.txt: heads must divide dim, kv_heads heads, and Dh be even")
        plist = read_params(d, c)
        sizes = [math.prod(s) for _, s in plist]
        total = sum(sizes)
        init = read_f32(d, "init.bin", total)
        final = read_f32(d, "final.bin", total)
        grad0 = read_f32(d, "grad0.bin", total)
        rows = read_losses(d)
        steps = len(rows)
        if steps != c["steps"]:
            raise DumpError(f"loss.txt has {steps} steps, config.txt {c['steps']}")
        row = c["batch"] * (c["seq"] + 1)
        tok = np.fromfile(os.path.join(d, "tokens.bin"), dtype="<i4")
        if tok.size != steps * row:
            raise DumpError(f"tokens.bin: {tok.size} values, [steps {steps}, batch {c['batch']}, "
                            f"seq + 1 {c['seq'] + 1}] needs {steps * row}")
        if tok.min() < 0 or tok.max() >= c["vocab"]:
            raise DumpError(f"tokens.bin: a token outside [0, {c['vocab']})")
        sep = None
        if c.get("packed", 0):
            with open(os.path.join(d, "separator.bin"), "rb") as f:
                sep = list(f.read())
            if not sep:
                raise DumpError("separator.bin: empty (config.txt says packed)")
    except (OSError, ValueError, DumpError) as e:
        print(f"check_dump: {e}", file=sys.stderr)
        return 2

    run_dtype, how = args.run_dtype, "given"
    if run_dtype == "auto":
        run_dtype, how = (c["dtype"], "config.txt") if "dtype" in c else (run_dtype_of(init), "detected")
    tol = TOLERANCES[run_dtype]
    # a float32 replay adds its own rounding, as large as an fp32 run's
    widen = 2.0 if args.dtype == "float32" else 1.0
    lrs = [r[3] for r in rows]
    tokens = torch.from_numpy(tok.reshape(steps, c["batch"], c["seq"] + 1).astype(np.int64))
    schedule = "constant" if all(lr == c["lr"] for lr in lrs) else "per step from loss.txt"
    print(f"check_dump: {d}: {c['layers']} layers, dim {c['dim']}, heads {c['heads']}/"
          f"{c['kv_heads']}, ffn {c['ffn']}, seq {c['seq']}, batch {c['batch']}, {steps} steps, "
          f"{total} parameters; lr {c['lr']:g} ({schedule}); the run in {run_dtype} "
          f"({how}), the replay in {args.dtype}")

    if sep is not None:
        print(f"check_dump: packed: documents end after each {bytes(sep)!r}")
    exact = replay(c, plist, init, tokens, lrs, torch.float64, sep)
    single = replay(c, plist, init, tokens, lrs, torch.float32, sep)
    ref = exact if args.dtype == "float64" else single
    run = {"loss": np.array([r[1] for r in rows]), "norm": np.array([r[2] for r in rows])}
    drift = {k: float(relative(np.abs(single[k] - exact[k]), exact[k]).max()) for k in run}
    print(f"PyTorch float32 vs float64 over the run: losses {drift['loss']:.1e}, norms "
          f"{drift['norm']:.1e} relative (the fp32 noise of this trajectory)")
    print(f"{'item':<26}{'max abs diff':>14}{'max rel diff':>14}   tolerance")
    ok_all = True

    def line(label, ok, da, dr, bound):
        nonlocal ok_all
        ok_all &= ok
        print(f"{label:<26}{da:14.3e}{dr:14.3e}   {bound}{'' if ok else '   FAIL'}")
        return ok

    # each step's loss and norm: step 0 from the pass's rounding, later ones
    # also from the drift (see TOLERANCES)
    steps_ok = True
    for k in ("loss", "norm"):
        t0 = tol[k + "0"] * widen
        steps_ok &= line(f"{k}, step 0", *compare(run[k][:1], ref[k][:1], t0, 0.0), f"rel {t0:.1e}")
        if steps == 1:
            continue
        if tol[k] is None:
            _, da, dr = compare(run[k][1:], ref[k][1:], 0.0, 0.0)
            print(f"{k + ', steps 1..':<26}{da:14.3e}{dr:14.3e}   (not checked in {run_dtype})")
            continue
        later = tol[k] * widen
        if run_dtype == "fp32":
            later = max(later, 2.0 * drift[k] * widen)
        steps_ok &= line(f"{k}, steps 1..", *compare(run[k][1:], ref[k][1:], later, 0.0),
                         f"rel {later:.1e}")
    if args.verbose or not steps_ok:
        for s in range(steps):
            print(f"  step {s}: loss {run['loss'][s]:.9g} (replay {ref['loss'][s]:.9g}), "
                  f"norm {run['norm'][s]:.9g} (replay {ref['norm'][s]:.9g})")

    # the first step's gradients
    gmax = float(np.abs(ref["grad0"]).max())
    grtol, gatol = tol["grad_rtol"] * widen, tol["grad_atol"] * widen * gmax
    got = grad0.astype(np.float64)
    ok = line("grad0.bin", *compare(got, ref["grad0"], grtol, gatol),
              f"rel {grtol:.0e} + {tol['grad_atol'] * widen:.0e} x max |grad| ({gmax:.3g})")
    offsets = np.cumsum([0] + [math.prod(s) for _, s in plist])
    if args.verbose or not ok:
        for i, (name, _) in enumerate(plist):
            sl = slice(offsets[i], offsets[i + 1])
            oki, dai, dri = compare(got[sl], ref["grad0"][sl], grtol, gatol)
            print(f"  {name:<24}{dai:14.3e}{dri:14.3e}{'' if oki else '   FAIL'}")

    # the final parameters: every element within twice AdamW's reach, all but
    # param_loose of them within param_rtol |w| + param_reach x the reach
    reach = sum(lrs) * widen
    got, want = final.astype(np.float64), ref["final"]
    diff = np.abs(got - want)
    prtol = tol["param_rtol"] * widen
    within = diff <= prtol * np.abs(want) + tol["param_reach"] * reach
    loose = int(np.count_nonzero(~within))
    far = int(np.count_nonzero(~(diff <= prtol * np.abs(want) + 2 * reach)))
    ok = loose <= tol["param_loose"] * total and far == 0 and bool(np.all(np.isfinite(got)))
    rel = relative(diff, want)
    line("final.bin", ok, float(diff.max()), float(rel.max()),
         f"rel {prtol:.1e} + {tol['param_reach']:g} x reach {reach:.3g}: {loose} of {total} "
         f"beyond (at most {int(tol['param_loose'] * total)}), {far} beyond {2 * reach:.3g}")
    if args.verbose or not ok:
        for i, (name, _) in enumerate(plist):
            sl = slice(offsets[i], offsets[i + 1])
            print(f"  {name:<24}{diff[sl].max():14.3e}{rel[sl].max():14.3e}"
                  f"   {int(np.count_nonzero(~within[sl]))} beyond")

    print(f"check_dump: {'the replay matches' if ok_all else 'MISMATCH'}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
