#!/usr/bin/env python3
"""bench/attention_sdpa.py — PyTorch scaled_dot_product_attention on the shapes
of bench/attention.c section (a), for comparison on a GPU machine.

Each backend is selected explicitly with torch.nn.attention.sdpa_kernel
(FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION), so a number is never
silently produced by a fallback; a backend that refuses a shape is reported
as "unsupported" with PyTorch's reason. bf16, causal and not.

TFLOPS counts 4*B*H*S*S*D flops, halved for causal, as bench/attention does.
Timing: CUDA events around each call, warmup then --iters calls, median.

PyTorch is not a dependency of dtensor; this script only runs where torch
with CUDA is installed:
    python3 bench/attention_sdpa.py [--iters 20] [--json]
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


def flops(b, h, s, d, causal):
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

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
    results = []
    if not args.json:
        print(f"attention_sdpa  torch {torch.__version__}  {torch.cuda.get_device_name(dev)}")
        print(f"{'shape (B,H,S,D)':<20} {'backend':<10} {'mask':<7} {'ms':>9} {'TFLOPS':>8}")
    for (b, h, s, d) in SHAPES:
        # SDPA takes [B, H, S, D]; dtensor's [B, S, H, D] is a transpose of it.
        q = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
        for causal in (True, False):
            for name, be in backends:
                row = {"B": b, "H": h, "S": s, "D": d, "backend": name, "causal": causal,
                       "dtype": "bf16"}
                if be is None:
                    row["error"] = "this PyTorch has no CUDNN_ATTENTION backend"
                    results.append(row)
                    continue
                try:
                    with sdpa_kernel([be]):
                        for _ in range(args.warmup):
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        torch.cuda.synchronize()
                        times = []
                        for _ in range(args.iters):
                            e0 = torch.cuda.Event(enable_timing=True)
                            e1 = torch.cuda.Event(enable_timing=True)
                            e0.record()
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            e1.record()
                            e1.synchronize()
                            times.append(e0.elapsed_time(e1) / 1e3)
                    t = statistics.median(times)
                    row["median_ms"] = t * 1e3
                    row["tflops"] = flops(b, h, s, d, causal) / t / 1e12
                except RuntimeError as e:  # the selected backend refused the inputs
                    row["error"] = str(e).splitlines()[0][:200]
                results.append(row)
                if not args.json:
                    shape = f"{b},{h},{s},{d}"
                    mask = "causal" if causal else "none"
                    if "error" in row:
                        print(f"{shape:<20} {name:<10} {mask:<7} unsupported: {row['error']}")
                    else:
                        print(f"{shape:<20} {name:<10} {mask:<7} {row['median_ms']:9.3f} "
                              f"{row['tflops']:8.1f}")
        del q, k, v
        torch.cuda.empty_cache()
    if args.json:
        json.dump({"bench": "attention_sdpa", "torch": torch.__version__,
                   "device": torch.cuda.get_device_name(dev), "iters": args.iters,
                   "results": results}, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
