#!/usr/bin/env python3
"""bench/attention_sdpa.py — PyTorch scaled_dot_product_attention on the shapes
of bench/attention.c section (a), forward and backward, for comparison on a
GPU machine.

Each backend is selected explicitly with torch.nn.attention.sdpa_kernel
(FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION), so a number is never
silently produced by a fallback; a backend that refuses a shape is reported
as "unsupported" with PyTorch's reason. bf16, causal and not.

Passes (--pass fwd,bwd, default both), as in bench/attention.c:
  fwd  times F.scaled_dot_product_attention(q, k, v);
  bwd  times the backward alone: the forward runs once under the same
       sdpa_kernel selection (which fixes the backward kernel autograd runs),
       outside the timed region, and each timed call is
       torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), which
       returns dq, dk, dv without accumulating into .grad.
TFLOPS counts 4*B*H*S*S*D flops for fwd and 2.5x that for bwd, halved for
causal, as bench/attention does.
Timing: CUDA events around each call, warmup then --iters calls, median.

PyTorch is not a dependency of dtensor; this script only runs where torch
with CUDA is installed:
    python3 bench/attention_sdpa.py [--iters 20] [--pass fwd,bwd] [--json]
"""
import argparse
import json
import statistics
import sys

SHAPES = [  # (B, H, S, D): the shapes
    (1, 16, 4096, 128),
    (1, 16, 16384, 128),
    (1, 32, 8192, 64),
]

PASSES = ("fwd", "bwd")


def flops(b, h, s, d, causal, pass_="fwd"):
    f = 4.0 * b * h * s * s * d
    if pass_ == "bwd":
        f *= 2.5
    return f / 2 if causal else f


def parse_passes(text):
    names = text.split(",")
    if not names or any(n not in PASSES for n in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"takes fwd, bwd or fwd,bwd; got '{text}'")
    return [p for p in PASSES if p in names]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--pass", dest="passes", type=parse_passes, default=list(PASSES),
                    help="fwd, bwd or fwd,bwd (default both)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be >= 1 and --warmup >= 0")

    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        print(f"attention_sdpa: needs PyTorch >= 2.3 with CUDA ({e})", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("attention_sdpa: no CUDA device: this script only runs on a GPU machine",
              file=sys.stderr)
        return 3

    backends = [
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None)),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ]
    dev = torch.device("cuda")

    def median_time(call):
        """Median seconds of call() over args.iters, CUDA events around each."""
        for _ in range(args.warmup):
            call()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            call()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3)
        return statistics.median(times)

    results = []
    if not args.json:
        print(f"attention_sdpa  torch {torch.__version__}  {torch.cuda.get_device_name(dev)}")
        print("passes: " + ",".join(args.passes) + "  (bwd: the backward alone, its forward "
              "run once untimed; TFLOPS with 2.5x the forward flops)")
        print(f"{'shape (B,H,S,D)':<20} {'pass':<4} {'backend':<10} {'mask':<7} {'ms':>9} "
              f"{'TFLOPS':>8}")
    for pass_ in args.passes:
        for (b, h, s, d) in SHAPES:
            # SDPA takes [B, H, S, D]; dtensor's [B, S, H, D] is a transpose of it.
            grad = pass_ == "bwd"
            q = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=grad)
            k = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=grad)
            v = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16, requires_grad=grad)
            dout = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) if grad else None
            for causal in (True, False):
                for name, be in backends:
                    row = {"pass": pass_, "B": b, "H": h, "S": s, "D": d, "backend": name,
                           "causal": causal, "dtype": "bf16"}
                    if be is None:
                        row["error"] = "this PyTorch has no CUDNN_ATTENTION backend"
                    else:
                        o = None
                        try:
                            with sdpa_kernel([be]):
                                if pass_ == "fwd":
                                    t = median_time(lambda: F.scaled_dot_product_attention(
                                        q, k, v, is_causal=causal))
                                else:
                                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                                    t = median_time(lambda: torch.autograd.grad(
                                        o, (q, k, v), dout, retain_graph=True))
                            row["median_ms"] = t * 1e3
                            row["tflops"] = flops(b, h, s, d, causal, pass_) / t / 1e12
                        except (RuntimeError, NotImplementedError) as e:
                            # the selected backend refused the inputs (or has no backward)
                            row["error"] = str(e).splitlines()[0][:200] if str(e) else repr(e)
                        del o
                    results.append(row)
                    if not args.json:
                        shape = f"{b},{h},{s},{d}"
                        mask = "causal" if causal else "none"
                        if "error" in row:
                            print(f"{shape:<20} {pass_:<4} {name:<10} {mask:<7} "
                                  f"unsupported: {row['error']}")
                        else:
                            print(f"{shape:<20} {pass_:<4} {name:<10} {mask:<7} "
                                  f"{row['median_ms']:9.3f} {row['tflops']:8.1f}")
                        sys.stdout.flush()
            del q, k, v, dout
            torch.cuda.empty_cache()
    if args.json:
        json.dump({"bench": "attention_sdpa", "torch": torch.__version__,
                   "device": torch.cuda.get_device_name(dev), "iters": args.iters,
                   "passes": args.passes, "results": results}, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
