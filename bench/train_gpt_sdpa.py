#!/usr/bin/env python3
"""bench/train_gpt_sdpa.py — the model of examples/train_gpt.c trained in
PyTorch on one GPU, for side-by-side tokens a second and MFU.

    python3 bench/train_gpt_sdpa.py [--layers 12 --dim 768 --heads 12
        --kv-heads 12 --ffn 3072 --seq 8192 --batch 1] [--steps 10]
        [--warmup-steps 3] [--sdpa cudnn|flash|efficient|math]
        [--peak-tflops 989.4] [--compile] [--device cuda]

The model is train_gpt's (its top comment), built here in PyTorch's
idioms: y = x @ W (W [in, out]); h = tok_emb[x]; per layer a =
rmsnorm(h, attn_norm), q, k, v = a @ wq, a @ wk, a @ wv as [B, S, H|Hkv,
Dh], rotary "half" on q and k (pairs i and i + Dh/2 at angle p *
10000^(-2i/Dh)), causal attention with scale 1/sqrt(Dh) (query head j reads
kv head j // (H/Hkv)), h += o @ wo, m = rmsnorm(h, mlp_norm), h +=
(silu(m @ w_gate) * (m @ w_up)) @ w_down; logits = rmsnorm(h, norm) @
lm_head, the loss the mean cross-entropy over the vocabulary of 256 bytes.
How PyTorch users train it: fp32 parameters under bf16 autocast (fp32
master weights and moments, as train_gpt --dtype bf16), attention by
F.scaled_dot_product_attention on the SDPA backend named by --sdpa
(cudnn: cuDNN's, flash: FlashAttention-2), clip_grad_norm_ to 1.0,
torch.optim.AdamW(fused=True) with weight decay 0.1 on the matrices, lr
3e-4. Tokens are random bytes: the speed does not depend on them.

Prints one line a step and then, over the steps after --warmup-steps, the
median step time, tokens a second and the MFU (the same formula as
train_gpt: 6 flops per matmul parameter and token, tok_emb excluded, plus
causal attention's 6 L S H Dh, over --peak-tflops), and the peak memory
(torch.cuda.max_memory_allocated). The last line is machine-readable:

    result sdpa=cudnn seq=8192 batch=1 step_ms=... tok_s=... mfu=... peak_mib=...

Exit status: 0 trained, 1 a step failed (its error printed: out of memory
reads "result ... error=oom"), 2 bad flags, no PyTorch 2.3 or later, or no
GPU (--device cpu runs on the CPU: tests/test_bench.c's smoke test).
A benchmark tool only: PyTorch is never a dependency of the library.
"""
import argparse
import contextlib
import math
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:   # the message below says so
    torch = F = None
    MISSING = e

VOCAB = 256


def flops_per_token(a):
    """train_gpt's flops_per_token: 6 per matmul parameter (tok_emb, a
    lookup, excluded; lm_head included) plus 6 L S H Dh of causal attention."""
    dh = a.dim // a.heads
    per_layer = a.dim * (a.heads * dh) + 2 * a.dim * (a.kv_heads * dh) + (a.heads * dh) * a.dim \
        + 3 * a.dim * a.ffn
    n = a.layers * per_layer + a.dim * VOCAB
    return 6.0 * n + 6.0 * a.layers * a.seq * a.heads * dh


def attention(q, k, v):   # [B, heads, S, Dh], causal, scale 1/sqrt(Dh)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # PyTorch before 2.0 (--sdpa math only): the same, written out
    S = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    causal = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(s.masked_fill(~causal, float("-inf")).float(), dim=-1).to(v.dtype) @ v


class Gpt(torch.nn.Module if torch else object):
    def __init__(self, a):
        super().__init__()
        self.a, self.dh = a, a.dim // a.heads
        P = torch.nn.Parameter

        def mat(rows, cols, scale=0.02):
            return P(torch.randn(rows, cols) * scale)

        self.tok_emb = mat(VOCAB, a.dim)
        self.layers = torch.nn.ModuleList()
        out_scale = 0.02 / math.sqrt(2 * a.layers)
        for _ in range(a.layers):
            layer = torch.nn.Module()
            layer.attn_norm = P(torch.ones(a.dim))
            layer.wq = mat(a.dim, a.heads * self.dh)
            layer.wk = mat(a.dim, a.kv_heads * self.dh)
            layer.wv = mat(a.dim, a.kv_heads * self.dh)
            layer.wo = mat(a.heads * self.dh, a.dim, out_scale)
            layer.mlp_norm = P(torch.ones(a.dim))
            layer.w_gate = mat(a.dim, a.ffn)
            layer.w_up = mat(a.dim, a.ffn)
            layer.w_down = mat(a.ffn, a.dim, out_scale)
            self.layers.append(layer)
        self.norm = P(torch.ones(a.dim))
        self.lm_head = mat(a.dim, VOCAB)
        i = torch.arange(self.dh // 2, dtype=torch.float64)
        angle = torch.outer(torch.arange(a.seq, dtype=torch.float64), 10000.0 ** (-2.0 * i / self.dh))
        self.register_buffer("cos", angle.cos().float()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angle.sin().float()[None, :, None, :], persistent=False)

    @staticmethod
    def rmsnorm(x, w):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    def rotary(self, x):   # [B, S, heads, Dh]
        h = self.dh // 2
        a, b = x[..., :h], x[..., h:]
        c, s = self.cos.to(x.dtype), self.sin.to(x.dtype)
        return torch.cat((a * c - b * s, a * s + b * c), dim=-1)

    def forward(self, x, y):
        B, S = x.shape
        a_ = self.a
        h = F.embedding(x, self.tok_emb)
        for L in self.layers:
            a = self.rmsnorm(h, L.attn_norm)
            q = self.rotary((a @ L.wq).view(B, S, a_.heads, self.dh)).transpose(1, 2)
            k = self.rotary((a @ L.wk).view(B, S, a_.kv_heads, self.dh)).transpose(1, 2)
            v = (a @ L.wv).view(B, S, a_.kv_heads, self.dh).transpose(1, 2)
            if a_.kv_heads != a_.heads:   # query head j reads kv head j // (H / Hkv)
                rep = a_.heads // a_.kv_heads
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            o = attention(q, k, v)
            h = h + o.transpose(1, 2).reshape(B, S, -1) @ L.wo
            m = self.rmsnorm(h, L.mlp_norm)
            h = h + (F.silu(m @ L.w_gate) * (m @ L.w_up)) @ L.w_down
        logits = self.rmsnorm(h, self.norm) @ self.lm_head
        return F.cross_entropy(logits.reshape(B * S, -1).float(), y.reshape(B * S))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 12), ("dim", 768), ("heads", 12), ("kv-heads", 0),
                          ("ffn", 3072), ("seq", 8192), ("batch", 1), ("steps", 10),
                          ("warmup-steps", 3)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--sdpa", choices=("cudnn", "flash", "efficient", "math"), default="cudnn")
    ap.add_argument("--peak-tflops", type=float, default=989.4,
                    help="the peak for the MFU (default: H100/H200 SXM bf16 dense, 989.4)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    if torch is None:
        print(f"train_gpt_sdpa: needs PyTorch ({MISSING})", file=sys.stderr)
        return 2
    a.kv_heads = a.kv_heads or a.heads
    if a.dim % a.heads or (a.dim // a.heads) % 2 or a.heads % a.kv_heads or a.steps <= a.warmup_steps:
        print("train_gpt_sdpa: --heads must divide --dim into an even head dim, --kv-heads "
              "divide --heads, --steps exceed --warmup-steps", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("train_gpt_sdpa: no CUDA device", file=sys.stderr)
        return 2
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION,
                               "flash": SDPBackend.FLASH_ATTENTION,
                               "efficient": SDPBackend.EFFICIENT_ATTENTION,
                               "math": SDPBackend.MATH}[a.sdpa])
    except ImportError:
        if a.sdpa != "math":
            print(f"train_gpt_sdpa: --sdpa {a.sdpa} needs PyTorch 2.3 or later "
                  f"(torch.nn.attention; this is {torch.__version__})", file=sys.stderr)
            return 2
        backend = contextlib.nullcontext()   # math: attention() written out
    dev = torch.device(a.device)
    torch.manual_seed(1)
    model = Gpt(a).to(dev)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if dev.type == "cuda" else {}))
    step_fn = torch.compile(model) if a.compile else model
    tokens = torch.randint(0, VOCAB, (a.steps, a.batch, a.seq + 1), device=dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    fpt = flops_per_token(a)
    times = []
    head = f"result sdpa={a.sdpa} seq={a.seq} batch={a.batch}"
    for s in range(a.steps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        try:
            with backend, torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = step_fn(tokens[s, :, :-1], tokens[s, :, 1:])
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        except torch.cuda.OutOfMemoryError as e:
            print(f"train_gpt_sdpa: step {s}: out of memory: {e}", file=sys.stderr)
            print(f"{head} error=oom", flush=True)
            return 1
        except RuntimeError as e:
            print(f"train_gpt_sdpa: step {s}: {e}", file=sys.stderr)
            print(f"{head} error=runtime", flush=True)
            return 1
        dt = time.perf_counter() - t0
        if s >= a.warmup_steps:
            times.append(dt)
        tok = a.batch * a.seq / dt
        print(f"step {s:4d} | loss {loss.item():.4f} | grad norm {norm.item():.4f} | "
              f"{dt * 1e3:9.2f} ms | {tok:10.0f} tok/s | MFU {100 * tok * fpt / (a.peak_tflops * 1e12):6.2f}%",
              flush=True)
    ms = statistics.median(times) * 1e3
    tok = a.batch * a.seq / (ms / 1e3)
    mfu = tok * fpt / (a.peak_tflops * 1e12)
    peak = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else 0.0
    print(f"train_gpt_sdpa: median of {len(times)} steps: {ms:.2f} ms, {tok:.0f} tok/s, MFU "
          f"{100 * mfu:.2f}% of {a.peak_tflops} TFLOPS; peak memory {peak:.0f} MiB "
          f"(PyTorch {torch.__version__}, {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'})")
    print(f"{head} step_ms={ms:.3f} tok_s={tok:.1f} mfu={mfu:.6g} peak_mib={peak:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
