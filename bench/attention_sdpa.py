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

bench/attention_report.py imports the timing functions (load_torch, sdpa_backends,
make_inputs, median_time, time_sdpa, sdpa_row, flops) from here; importing
this module does not import torch.
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


def load_torch():
    """torch, torch.nn.functional, SDPBackend and sdpa_kernel as a namespace;
    ImportError (with PyTorch's reason) where they cannot be imported."""
    import types
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return types.SimpleNamespace(torch=torch, F=F, SDPBackend=SDPBackend,
                                 sdpa_kernel=sdpa_kernel)


def sdpa_backends(t):
    """(name, SDPBackend member or None where this PyTorch lacks it), in table order."""
    return [
        ("flash", t.SDPBackend.FLASH_ATTENTION),
        ("cudnn", getattr(t.SDPBackend, "CUDNN_ATTENTION", None)),
        ("efficient", t.SDPBackend.EFFICIENT_ATTENTION),
    ]


def make_inputs(t, b, h, s, d, grad, dev):
    """q, k, v of [B, H, S, D] bf16 (SDPA's layout; dtensor's [B, S, H, D] is a
    transpose of it) and, for the backward (grad), a random dout; else None."""
    def rand():
        return t.torch.randn(b, h, s, d, device=dev, dtype=t.torch.bfloat16, requires_grad=grad)
    q, k, v = rand(), rand(), rand()
    dout = t.torch.randn(b, h, s, d, device=dev, dtype=t.torch.bfloat16) if grad else None
    return q, k, v, dout


BUSY_CYCLES = 2_000_000   # about 1 ms of the GPU's clock


def median_time(t, call, iters, warmup):
    """Median seconds of call() over iters calls after warmup ones, CUDA events
    around each. The stream spins for about 1 ms before the first event, so
    that Python's and PyTorch's work for the call happens while the GPU is
    busy and the events hold the GPU's time alone (bench/blocks does the
    same for dtensor's kernels)."""
    for _ in range(warmup):
        call()
    t.torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        e0 = t.torch.cuda.Event(enable_timing=True)
        e1 = t.torch.cuda.Event(enable_timing=True)
        t.torch.cuda._sleep(BUSY_CYCLES)
        e0.record()
        call()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    return statistics.median(times)


def time_sdpa(t, backend, q, k, v, dout, causal, pass_, iters, warmup):
    """Median seconds of one pass with only `backend` allowed. fwd times the
    forward; bwd runs the forward once, untimed, under the same selection
    (which fixes the backward kernel), then times torch.autograd.grad alone.
    Raises RuntimeError or NotImplementedError where the backend refuses."""
    o = None
    try:
        with t.sdpa_kernel([backend]):
            if pass_ == "fwd":
                return median_time(t, lambda: t.F.scaled_dot_product_attention(
                    q, k, v, is_causal=causal), iters, warmup)
            o = t.F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return median_time(t, lambda: t.torch.autograd.grad(
                o, (q, k, v), dout, retain_graph=True), iters, warmup)
    finally:
        del o


def sdpa_row(t, name, backend, inputs, shape, causal, pass_, iters, warmup):
    """One result row: the case, then median_ms and tflops, or error (the
    backend's refusal, first line) where it cannot run the case."""
    b, h, s, d = shape
    row = {"pass": pass_, "B": b, "H": h, "S": s, "D": d, "backend": name,
           "causal": causal, "dtype": "bf16"}
    if backend is None:
        row["error"] = "this PyTorch has no CUDNN_ATTENTION backend"
        return row
    try:
        sec = time_sdpa(t, backend, *inputs, causal, pass_, iters, warmup)
        row["median_ms"] = sec * 1e3
        row["tflops"] = flops(b, h, s, d, causal, pass_) / sec / 1e12
    except (RuntimeError, NotImplementedError) as e:
        # the selected backend refused the inputs (or has no backward)
        row["error"] = str(e).splitlines()[0][:200] if str(e) else repr(e)
    return row


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
        t = load_torch()
    except ImportError as e:
        print(f"attention_sdpa: needs PyTorch >= 2.3 with CUDA ({e})", file=sys.stderr)
        return 3
    torch = t.torch
    if not torch.cuda.is_available():
        print("attention_sdpa: no CUDA device: this script only runs on a GPU machine",
              file=sys.stderr)
        return 3

    backends = sdpa_backends(t)
    dev = torch.device("cuda")
    results = []
    if not args.json:
        print(f"attention_sdpa  torch {torch.__version__}  {torch.cuda.get_device_name(dev)}")
        print("passes: " + ",".join(args.passes) + "  (bwd: the backward alone, its forward "
              "run once untimed; TFLOPS with 2.5x the forward flops)")
        print(f"{'shape (B,H,S,D)':<20} {'pass':<4} {'backend':<10} {'mask':<7} {'ms':>9} "
              f"{'TFLOPS':>8}")
    for pass_ in args.passes:
        for (b, h, s, d) in SHAPES:
            inputs = make_inputs(t, b, h, s, d, pass_ == "bwd", dev)
            for causal in (True, False):
                for name, be in backends:
                    row = sdpa_row(t, name, be, inputs, (b, h, s, d), causal, pass_,
                                   args.iters, args.warmup)
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
            del inputs
            torch.cuda.empty_cache()
    if args.json:
        json.dump({"bench": "attention_sdpa", "torch": torch.__version__,
                   "device": torch.cuda.get_device_name(dev), "iters": args.iters,
                   "passes": args.passes, "results": results}, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
