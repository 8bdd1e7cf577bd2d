#!/usr/bin/env python3
"""bench/attention_report.py — dtensor's attention figures on a GPU in one run.

The kernels' and the ring's figures, beside PyTorch's measured in the same
run on the same GPU, each with its target and a PASS / FAIL mark.

What runs, in this order, so that the figures still short of their targets
come first when --budget runs out (forward and backward speed, met on the
H200, come after them):
  causal efficiency  r = causal time / full time, c = 1024..16384, H = 32,
          D = 128: bench/blocks (r) (also striped blocks) beside SDPA on
          [1, 32, c, 128]; target r <= 0.55 for c >= 4096. Again with the
          heads one after another (--l2 0).
  causal efficiency, CTA timelines  the same run's --trace: each full and
          causal block run once more with its CTAs recording themselves:
          the SMs' idle share, the drain after the last CTA start, a CTA's
          cycles per key tile and fixed cost, split into its start, its
          loop's own and its end (no target: where r's time goes).
  the ring on one device  bench/blocks (p): P = 8 ranks on one device;
          ring balance: striped / contiguous critical path >= 0.95 of
          (r + P - 1) / (P r) and >= 1.75 at c = 8192; ring cost: all
          blocks back to back <= 1.05x one causal call at S = 32768.
  the ring on one device, CTA timelines  the same runs' --trace: the ring's
          launches summed (span, drain, packed time) beside the one call's.
  the ring on one device, one timeline  the same runs' --trace: the ring's
          launches back to back as one device timeline, the SMs' busy and
          idle time beside the one call's: b2b/call split into extra work
          and idle time.
  exposed communication  bench/attention (b) with DT_ATTN_KERNEL set, the
          ring's calls back to back, with the copies and without them
          (--copies 0: the local transport moves no data); exposed =
          (with - without) / with <= 5% for C >= 4096. Beside it
          bench/blocks (p) with the same P, C, H, D: the ring's blocks
          alone, back to back. The wgmma kernel once more with
          --comm-ctas 0 (the communication stream's copies by the driver
          and its adds on as many SMs as they get instead of the default's
          kernels of a few CTAs, 32 shared by the ranks on a GPU; the
          ring's blocks alone are the default's, which they do not
          change), and with --persistent 2 (persistent beside the copies
          too).
  exposed communication, one timeline  the backward's bench/blocks (p) run
          at P = 8 with --trace: its blocks back to back as one device
          timeline against one backward call (no target: the backward
          ring's cost).
  forward TFLOPS  on the three reference shapes, causal and not, bf16:
          build/bench/blocks section (r) per --kernels entry (the forward
          block kernel alone on one full and one causal S x S block) beside
          SDPA's FLASH_ATTENTION (FA2) and CUDNN_ATTENTION; target >= 1.0x
          FA2.
  backward TFLOPS  (2.5x the forward flops): bench/blocks (r) --pass bwd
          beside SDPA's backward; target >= 0.9x FA2.
  backward CTA timelines  the same runs' --trace: a backward CTA's cycles
          per query tile and fixed cost (start, loop, end: the wgmma
          backward's marks), at c = 4096 (a ring step's block) against the
          long blocks (no target: where the backward ring's extra work
          goes).
  forward through the public API  bench/attention (a) --dtype bf16 with
          DT_ATTN_KERNEL set to each kernel: the whole dt_attention_forward.
  the ring with its steps grouped  last (a diagnosis): bench/blocks (p) at
          the first ring c with --group 2,3,4,7 --trace, a run of its own
          (the wgmma kernel, or the first of --kernels without it): each
          order's ring once more with a rank's steps grouped as the
          library groups them for dt_attention_options.group = G (their
          keys one segment: fewer query tiles' visits), its b2b/call, the
          F it implies and its timeline's (no target: the tile model's
          steps per launch, measured).
The wgmma forward runs with the benches' default launch (at D = 128 the
overlapped order and the producer warpgroup); bench/blocks' and
bench/attention's --producer compare it with the others
(scripts/gpu_session.sh's ring-cost and --profile runs do).

Every dtensor figure comes from a subprocess (its command is printed) under a
timeout; PyTorch runs in this process with bench/attention_sdpa.py's timing
functions. The output is markdown, with the machine, the date, the commit
and every command (docs/PERFORMANCE.md takes its figures from it).

    python3 bench/attention_report.py [--build DIR] [--kernels mma,wgmma] [--iters N]
        [--budget SECONDS] [--step-timeout SECONDS]
        [--json] [--json-out FILE] [--quick] [--backend cuda|cpu] [--no-torch]

A bench that runs past --step-timeout is killed and its launch (the kernel
and its variant flags: --persistent) not run again, so a variant that hangs
leaves the kernel's other launches their budget. Exits 1 when a step failed
or timed out, 0 otherwise.

Python 3 standard library only; torch where it is importable (never needed).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no bench/__pycache__ in the source tree
import attention_sdpa as sdpa  # noqa: E402  (the SDPA timing functions; no torch import)

KERNELS = ("auto", "simple", "mma", "wgmma")
TORCH_NAMES = {"flash": "FA2", "cudnn": "cuDNN"}
RING_P = 8

# (B, H, S, D). The reference shapes are attention_sdpa's; --quick stands in
# tiny ones for them (a smoke test: its marks say nothing).
SIZES = {
    False: {"shapes": sdpa.SHAPES, "r_c": [1024, 2048, 4096, 8192, 16384], "r_h": 32,
            "r_d": 128, "ring_c": [4096, 8192], "iters": 10, "warmup": 5, "min_step": 20.0},
    True: {"shapes": [(1, 2, 128, 128), (1, 2, 256, 128), (1, 4, 128, 64)],
           "r_c": [64, 128, 256], "r_h": 2, "r_d": 128, "ring_c": [32], "iters": 2,
           "warmup": 1, "min_step": 1.0},
}
STEP_TIMEOUT_S = 150.0   # the longest any one subprocess may run (--step-timeout)
TF = ".4g"           # TFLOPS: 324.5 on a GPU, 0.02345 on the CPU

# The targets the marks are against.
FWD_VS_FA2 = 1.0
BWD_VS_FA2 = 0.9
R_MAX, R_FROM_C = 0.55, 4096
ACHIEVED_MIN, RATIO_MIN, RATIO_AT_C = 0.95, 1.75, 8192
VS_ONE_CALL_MAX, VS_ONE_CALL_AT_S = 1.05, 32768
# bench/blocks --group: the rings with a rank's steps grouped as the
# library groups them for dt_attention_options.group = G, at the first
# ring c (the tile model's steps per launch; bench/blocks --help)
RING_GROUPS = "2,3,4,7"
WAITS_MAX, WAITS_FROM_C = 0.05, 4096
COMM_CTAS = "0"   # exposed communication's variant of the comm stream's work: --comm-ctas (0: the driver's)


# ------------------------------------------------------------------ values

class NA:
    """A figure that is not there: short says why in a table cell, detail in
    the note under the table."""

    def __init__(self, short, detail=""):
        self.short, self.detail = short, detail

    def __str__(self):
        return "n/a: " + self.short

    def full(self):
        return str(self) + (f" ({self.detail})" if self.detail else "")


def is_na(x):
    return isinstance(x, NA)


def first_na(*xs):
    return next((x for x in xs if is_na(x)), None)


def ratio(a, b):
    return first_na(a, b) or a / b


def mark(x, ok):
    """PASS or FAIL for a measured x (ok: its test), the NA otherwise."""
    return x if is_na(x) else ("PASS" if ok(x) else "FAIL")


def jsonable(x):
    return x.full() if is_na(x) else x


# ------------------------------------------------------------------ tables

class Table:
    """One measurement's table: markdown cells for the text, numbers for --json."""

    def __init__(self, key, title, target, header, method):
        self.key, self.title, self.target, self.header = key, title, target, header
        self.method, self.rows, self.data, self.commands, self.nas = method, [], [], [], []

    def add(self, cells, data):
        """cells: (value, format) pairs or strings; data: the row for --json."""
        self.rows.append([self.cell(c) for c in cells])
        self.data.append({k: jsonable(v) for k, v in data.items()})

    def cell(self, c):
        value, spec = c if isinstance(c, tuple) else (c, "")
        if is_na(value):
            if value.detail and value.full() not in self.nas:
                self.nas.append(value.full())
            return str(value)
        return format(value, spec)

    def markdown(self):
        out = [f"## {self.title}", "", f"Target: {self.target}", ""]
        out.append("| " + " | ".join(self.header) + " |")
        out.append("|" + "---|" * len(self.header))
        out += ["| " + " | ".join(r) + " |" for r in self.rows]
        out += ["", self.method]
        if self.nas:
            out += [""] + [f"- {n}" for n in self.nas]
        if self.commands:
            out += ["", "```"] + self.commands + ["```"]
        return "\n".join(out) + "\n"

    def marks(self):
        cells = [c for r in self.rows for c in r]
        return {m: sum(c.endswith(m) for c in cells) for m in ("PASS", "FAIL")}

    def json(self):
        return {"title": self.title, "target": self.target, "method": self.method,
                "rows": self.data, "na": self.nas, "commands": self.commands,
                "marks": self.marks()}


# --------------------------------------------------------------- the session

class Session:
    """Options, the clock against --budget, and every step's record."""

    def __init__(self, args):
        self.args = args
        self.size = SIZES[args.quick]
        self.iters = args.iters or self.size["iters"]
        self.start = time.monotonic()
        self.steps, self.commands = [], []
        self.hung = set()   # launches (launch_of) whose bench ran past its timeout once
        self.torch = TorchSide(self)

    def left(self):
        return self.args.budget - (time.monotonic() - self.start)

    def out_of_budget(self):
        """An NA if no new step fits in what is left of --budget, else None."""
        left = self.left()
        if left < self.size["min_step"]:
            return NA("skipped (budget)", f"{max(left, 0):.0f} s of --budget "
                      f"{self.args.budget:.0f} s left")
        return None

    def binary(self, name):
        return os.path.join(self.args.build, "bench", name)

    def record(self, command, status, seconds, detail=""):
        self.steps.append({"command": command, "status": status,
                           "seconds": round(seconds, 2), "detail": detail})
        self.commands.append(command)
        progress(self, f"{status} in {seconds:.1f} s: {command}")

    def bench(self, argv, kernel, kernel_env=None):
        """Run one dtensor bench of `kernel` with --json: its object, or an NA
        saying why not. A launch (a kernel with its variant flags, launch_of)
        that ran past its timeout once (hung, most likely) is not run again:
        the budget goes to the others, that kernel's other variants included."""
        env = {k: v for k, v in os.environ.items() if k != "DT_ATTN_KERNEL"}
        prefix = ""
        if kernel_env:
            env["DT_ATTN_KERNEL"] = kernel_env
            prefix = f"DT_ATTN_KERNEL={kernel_env} "
        command = prefix + shlex.join(argv)
        launch = launch_of(kernel, argv)
        skip = self.out_of_budget()
        if launch in self.hung:
            skip = NA("skipped", f"{launch} timed out in an earlier step")
        if skip:
            self.steps.append({"command": command, "status": skip.short, "seconds": 0,
                               "detail": skip.detail})
            return skip
        timeout = min(self.left(), self.args.step_timeout)
        t0 = time.monotonic()
        done = run_with_timeout(argv, env, timeout)
        if done is None:
            self.hung.add(launch)
            self.record(command, "timed out", time.monotonic() - t0)
            return NA("timed out", f"killed after {timeout:.0f} s")
        return self.outcome(command, *done, time.monotonic() - t0)

    def outcome(self, command, returncode, stdout, stderr, seconds):
        why = last_line(stderr)
        if returncode == 0:
            # The object starts on a line of its own: lines before it are
            # other writers' (NCCL_DEBUG prints to stdout), kept as a note.
            lines = stdout.splitlines(keepends=True)
            first = next((i for i, ln in enumerate(lines) if ln.startswith("{")), 0)
            try:
                out = json.loads("".join(lines[first:]))
                self.record(command, "ok", seconds,
                            "before the JSON: " + lines[0].strip() if first else "")
                self.steps[-1]["output"] = out
                return out
            except ValueError as e:
                why = (f"its output is not one JSON object ({e}); it begins: "
                       f"{stdout[:120]!r}")
        elif returncode == 3 or "DT_ERR_NOT_SUPPORTED" in stderr:
            self.record(command, "not supported", seconds, why)
            return NA("not supported", why)
        rc = returncode
        status = f"failed (exit {rc})" if rc >= 0 else f"failed (signal {-rc})"
        self.record(command, status, seconds, why)
        return NA(status, why)

    # ---- bench command lines

    def blocks(self, kernel, section, pass_, heads, dim, sizes, ranks=RING_P, extra=()):
        """bench/blocks --json for one kernel: (r) at c in sizes, or (p) at ring c in sizes."""
        size_flag = ["--c"] if section == "r" else ["--ring-c"]
        argv = [self.binary("blocks"), "--backend", self.args.backend, "--kernel", kernel,
                "--section", section, "--pass", pass_, "--heads", str(heads), "--kv-heads",
                str(heads), "--dim", str(dim), "--dtype", "bf16", "--ranks", str(ranks)]
        argv += size_flag + [",".join(map(str, sizes)), "--iters", str(self.iters), "--json"]
        return self.bench(argv + list(extra), kernel)

    def attention(self, kernel, section, passes, extra=()):
        argv = [self.binary("attention"), "--backend", self.args.backend, "--section", section,
                "--pass", passes, "--iters", str(self.iters), "--json", *extra]
        if self.args.quick:
            argv.append("--quick")
        return self.bench(argv, kernel, kernel_env=kernel)


# The flags that make another launch of a kernel: a variant that hangs does
# not take the kernel's other launches with it.
VARIANT_FLAGS = ("--persistent", "--comm-ctas", "--dependent")


def launch_of(kernel, argv):
    """'wgmma', or 'wgmma --persistent 2': the kernel and the variant flags argv gives it."""
    words = [kernel]
    for i, a in enumerate(argv[:-1]):
        if a in VARIANT_FLAGS:
            words += [a, argv[i + 1]]
    return " ".join(words)


def run_with_timeout(argv, env, timeout):
    """(exit status, stdout, stderr) of argv, or None when it ran past timeout
    seconds: then it and everything it started (its own session) are killed."""
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:   # it ended meanwhile
            pass
        p.communicate()
        return None


def progress(session, text):
    elapsed = time.monotonic() - session.start
    print(f"attention_report [{elapsed:6.1f} s] {text}", file=sys.stderr, flush=True)


def last_line(text):
    """The last non-empty line of a bench's stderr, without the program's name."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return "no message"
    line = lines[-1]
    for prefix in ("bench/blocks: ", "bench/attention: "):
        if line.startswith(prefix):
            line = line[len(prefix):]
    return line[:240]


def bwd_kernel(kernel):
    """The backward kernel a DT_ATTN_KERNEL choice runs on an H100 or H200
    (auto's is wgmma's there, as its forward: block.h)."""
    return "wgmma" if kernel == "auto" else kernel


def bwd_choices(kernels):
    """The --kernels entries that run distinct backward kernels, first of each."""
    seen, out = set(), []
    for k in kernels:
        if bwd_kernel(k) not in seen:
            seen.add(bwd_kernel(k))
            out.append(k)
    return out


def kernel_label(kernel, pass_):
    if pass_ == "bwd" and bwd_kernel(kernel) != kernel:
        return f"{kernel} (bwd = {bwd_kernel(kernel)})"
    return kernel


# ------------------------------------------------------------- torch side

class TorchSide:
    """PyTorch SDPA in this process, through attention_sdpa's functions."""

    def __init__(self, session):
        self.session, self.t, self.dev, self.rows, self.done = session, None, None, [], {}
        self.na, self.about = self.load(session.args)

    def load(self, args):
        if args.no_torch:
            return NA("--no-torch"), "not run (--no-torch)"
        try:
            t = sdpa.load_torch()
        except ImportError as e:
            return NA("no torch", str(e)), f"not importable ({e})"
        if not t.torch.cuda.is_available():
            return NA("no CUDA in torch", f"torch {t.torch.__version__}"), \
                f"{t.torch.__version__}, no CUDA device"
        self.t, self.dev = t, t.torch.device("cuda")
        cuda = getattr(t.torch.version, "cuda", None)
        return None, (f"{t.torch.__version__} (CUDA {cuda}) on "
                      f"{t.torch.cuda.get_device_name(self.dev)}")

    def cases(self, shape, pass_, table):
        """{(backend name, causal): SDPA's row, or an NA} for FA2 and cuDNN, causal and
        not; measured once per shape and pass, then reused."""
        keys = [(n, c) for n in TORCH_NAMES for c in (True, False)]
        why = self.na or self.session.out_of_budget()
        if why:
            return {k: why for k in keys}
        s = self.session
        b, h, seq, d = shape
        command = (f"torch (this process): SDPA {pass_} {', '.join(TORCH_NAMES)} bf16 "
                   f"[B,H,S,D]=[{b},{h},{seq},{d}] causal and not, warmup {s.size['warmup']}, "
                   f"iters {s.iters}, CUDA events (bench/attention_sdpa.py time_sdpa)")
        if (shape, pass_) in self.done:
            table.commands.append(command + " [measured above, reused]")
            return self.done[(shape, pass_)]
        t0 = time.monotonic()
        try:
            inputs = sdpa.make_inputs(self.t, b, h, seq, d, pass_ == "bwd", self.dev)
        except RuntimeError as e:   # out of memory, say
            s.record(command, "failed", time.monotonic() - t0, str(e)[:200])
            return {k: NA("failed", str(e).splitlines()[0][:200]) for k in keys}
        backends = dict(sdpa.sdpa_backends(self.t))
        out = {}
        for name, causal in keys:
            row = sdpa.sdpa_row(self.t, name, backends[name], inputs, shape, causal, pass_,
                                s.iters, s.size["warmup"])
            self.rows.append(row)
            out[(name, causal)] = NA("refused", row["error"]) if "error" in row else row
        del inputs
        self.t.torch.cuda.empty_cache()
        s.record(command, "ok", time.monotonic() - t0)
        table.commands.append(command)
        self.done[(shape, pass_)] = out
        return out


def torch_value(row, key):
    return row if is_na(row) else row[key]


# ----------------------------------------------------------- dtensor rows

def rows_of(out, section, pass_):
    """The rows of one pass in a bench/blocks object, or the NA in their place."""
    if is_na(out):
        return out
    return [r for r in out[section] if r["pass"] == pass_]


def r_row(out, pass_, c):
    rows = rows_of(out, "r", pass_)
    if is_na(rows):
        return rows
    hit = [r for r in rows if r["c"] == c]
    return hit[0] if hit else NA("missing", f"no (r) row for c = {c}")


def field(row, key):
    return row if is_na(row) else row[key]


def run_blocks(session, table, kernel, section, pass_, heads, dim, sizes, ranks=RING_P, extra=()):
    """bench/blocks for one kernel, its command added to the table's."""
    n = len(session.commands)
    out = session.blocks(kernel, section, pass_, heads, dim, sizes, ranks, extra)
    table.commands += session.commands[n:]
    return out


def by_heads_dim(shapes):
    """Shapes grouped by (H, D): one bench/blocks run measures every S of a group."""
    groups = {}
    for (_, h, s, d) in shapes:
        groups.setdefault((h, d), []).append(s)
    return groups


# ------------------------------------------------------------------ tables

def table_throughput(session, pass_):
    """Forward or backward speed: TFLOPS per shape and mask beside FA2 and cuDNN."""
    fwd = pass_ == "fwd"
    target = FWD_VS_FA2 if fwd else BWD_VS_FA2
    kernels = session.args.kernels if fwd else bwd_choices(session.args.kernels)
    labels = [kernel_label(k, pass_) for k in kernels]
    header = ["B,H,S,D", "mask"] + labels + ["FA2", "cuDNN"]
    header += [f"{k} / FA2" for k in labels] + [f"{k} / cuDNN" for k in labels]
    if fwd:
        title = "forward TFLOPS, bf16"
        method = ("dtensor: build/bench/blocks section (r), the forward block kernel alone "
                  "(--kernel K) on one full and one causal S x S block, B = 1, H_kv = H; "
                  "CUDA events around each block's kernels (the host clock on the CPU), "
                  "median of the iterations after 1 warm-up; the wgmma kernel in its default "
                  "launch (at D = 128 the overlapped order, its loads by a producer "
                  "warpgroup). torch: F.scaled_dot_product_attention with one backend "
                  "forced (FA2 = FLASH_ATTENTION), CUDA events, median. TFLOPS = "
                  "4*B*H*S*S*D / time, halved for causal.")
    else:
        title = "backward TFLOPS, bf16"
        method = ("dtensor: build/bench/blocks section (r) --pass bwd, the backward block "
                  "kernel alone (lse and delta from a forward pass made before timing); "
                  "auto's backward is wgmma's, so it runs once. torch: "
                  "torch.autograd.grad of SDPA's output with the backend forced, its forward "
                  "untimed, CUDA events. TFLOPS count 2.5x the forward flops "
                  "(10*B*H*S*S*D), halved for causal.")
    table = Table("forward_tflops" if fwd else "backward_tflops", title, f"dtensor >= {target}x FA2 (the same shape "
                  "and mask, measured in this run)", header, method)
    shapes = session.size["shapes"]
    dt = {}
    session.bwd_outs = {}   # the backward's traced runs, for table_trace_bwd
    for k in kernels:
        for (h, d), seqs in by_heads_dim(shapes).items():
            out = run_blocks(session, table, k, "r", pass_, h, d, seqs,
                             extra=() if fwd else ("--trace",))
            if not fwd:
                session.bwd_outs[(k, h, d)] = out
            for s in seqs:
                dt[(k, h, s, d)] = r_row(out, pass_, s)
    torch = {shape: session.torch.cases(shape, pass_, table) for shape in shapes}
    for shape in shapes:
        _, h, s, d = shape
        for causal in (True, False):
            key = "tflops_causal" if causal else "tflops_full"
            ours = [field(dt[(k, h, s, d)], key) for k in kernels]
            fa2 = torch_value(torch[shape][("flash", causal)], "tflops")
            cudnn = torch_value(torch[shape][("cudnn", causal)], "tflops")
            vs_fa2 = [ratio(x, fa2) for x in ours]
            vs_cudnn = [ratio(x, cudnn) for x in ours]
            cells = [",".join(map(str, shape)), "causal" if causal else "none"]
            cells += [(x, TF) for x in ours] + [(fa2, TF), (cudnn, TF)]
            cells += [with_mark(v, lambda x: x >= target) for v in vs_fa2]
            cells += [(v, ".2f") for v in vs_cudnn]
            data = {"shape": list(shape), "causal": causal, "FA2_tflops": fa2,
                    "cuDNN_tflops": cudnn}
            for k, x, a, b in zip(kernels, ours, vs_fa2, vs_cudnn):
                data.update({f"{k}_tflops": x, f"{k}_vs_FA2": a, f"{k}_vs_cuDNN": b,
                             f"{k}_mark": mark(a, lambda v: v >= target)})
            table.add(cells, data)
    return table


def with_mark(value, ok, spec=".2f"):
    """'1.05 PASS' for a measured value, its NA otherwise."""
    if is_na(value):
        return value
    return f"{value:{spec}} {mark(value, ok)}"


# The causal r again with another launch: (label, key, bench/blocks
# flags, the kernels it applies to or None for all). A traced one's CTA
# timelines join the causal efficiency's (table_trace) as "kernel, label".
R_VARIANTS = (("heads in turn", "heads_in_turn", ("--l2", "0"), None),)


def table_r(session):
    """Causal efficiency r for c in the list, per kernel, beside SDPA's."""
    h, d, cs = session.size["r_h"], session.size["r_d"], session.size["r_c"]
    kernels = session.args.kernels
    header = ["c"]
    for k in kernels:
        header += [f"{k} r", f"{k} striped<= r", f"{k} striped< r", f"{k} mark"]
        header += [f"{k} r, {label}" for label, _, _, only in R_VARIANTS
                   if only is None or k in only]
    header += ["FA2 r", "cuDNN r"]
    table = Table("causal_efficiency", "causal efficiency: r = causal time / full time, forward",
                  f"r <= {R_MAX} for c >= {R_FROM_C}, for the causal block and both striped "
                  "blocks (marks only there)", header,
                  f"A c x c block, B = 1, H = {h}, D = {d}, bf16. dtensor: build/bench/blocks "
                  "section (r): the causal diagonal block and the striped blocks of "
                  f"P = {RING_P} ranks with the diagonal included (<=) and excluded (<), each "
                  "over a full block; 'heads in turn': the causal r again with --l2 0, the "
                  "CTAs launched one head after another, for comparison with the default "
                  "(heaviest tiles first across the heads of an L2-sized section). torch: SDPA "
                  "forward on [1, H, c, D] causal over not causal, with the backend forced.")
    outs = {k: run_blocks(session, table, k, "r", "fwd", h, d, cs, extra=("--trace",))
            for k in kernels}
    session.r_outs = dict(outs)   # for table_trace
    variants = {}
    for k in kernels:
        for label, key, flags, only in R_VARIANTS:
            if only is None or k in only:
                variants[(k, key)] = run_blocks(session, table, k, "r", "fwd", h, d, cs,
                                                extra=flags)
                if "--trace" in flags:
                    session.r_outs[f"{k}, {label}"] = variants[(k, key)]
    for c in cs:
        torch = session.torch.cases((1, h, c, d), "fwd", table)
        cells, data = [str(c)], {"c": c}
        for k in kernels:
            row = r_row(outs[k], "fwd", c)
            rs = [field(row, key) for key in ("r", "striped_le_r", "striped_lt_r")]
            worst = first_na(*rs) or max(rs)
            m = mark(worst, lambda x: x <= R_MAX) if c >= R_FROM_C else "-"
            cells += [(x, ".3f") for x in rs] + [m]
            data.update({f"{k}_r": rs[0], f"{k}_striped_le_r": rs[1],
                         f"{k}_striped_lt_r": rs[2], f"{k}_mark": m})
            for _, key, _, only in R_VARIANTS:
                if only is None or k in only:
                    other = field(r_row(variants[(k, key)], "fwd", c), "r")
                    cells.append((other, ".3f"))
                    data[f"{k}_r_{key}"] = other
        for name, label in TORCH_NAMES.items():
            full, causal = torch[(name, False)], torch[(name, True)]
            r = first_na(full, causal) or causal["median_ms"] / full["median_ms"]
            cells.append((r, ".3f"))
            data[f"{label}_r"] = r
        table.add(cells, data)
    return table


TRACE_BLOCKS = ("full", "causal")


def table_trace(session):
    """The causal efficiency's blocks, where their time goes: the CTA timelines of --trace."""
    h, d, cs = session.size["r_h"], session.size["r_d"], session.size["r_c"]
    header = ["kernel", "c", "block", "CTAs", "slots", "span us", "fill", "drain us",
              "drain share", "tiles", "cycles / tile", "fixed cycles", "fixed / tile", "GHz",
              "start cycles", "loop fixed cycles", "end cycles"]
    table = Table("causal_efficiency_trace", "causal efficiency, CTA timelines: where a "
                  "block's time goes", "none (a diagnosis of the causal efficiency)", header,
                  f"The (r) blocks of the causal efficiency (B = 1, H = {h}, D = {d}, bf16), each run once "
                  "more by the same command with --trace: every CTA records its start and "
                  "end (%globaltimer), SM and key tiles (attention/cta_trace.h). slots = the "
                  "most records running at once; fill = the SMs' busy time / (SMs x span), 1 "
                  "when no SM is ever idle; drain = from the last CTA's start to the end (no "
                  "CTA left to launch); cycles = cycles / tile x tiles + fixed, least squares "
                  "over the CTAs (clock64), fixed / tile = a CTA's fixed cost in key tiles "
                  "(none for a full block, whose CTAs all have the same tiles). The fixed "
                  "cost split by the forward kernels' marks (means over the CTAs with key "
                  "tiles): start = from a CTA's start to its first key tile landed; loop "
                  "fixed = the main loop's own fixed cycles, a line fitted through the "
                  "loops' cycles against their tiles; end = after its last key tile (the "
                  "rows' merge and write-back). The wgmma kernel marks at D = 128 only. "
                  "By default (the overlapped order) a wgmma CTA's query tiles' records "
                  "overlap in time (a tile ends when its second warpgroup has written its "
                  "rows, after the first began the next).")
    outs = getattr(session, "r_outs", {})
    for k in outs or session.args.kernels:
        for c in cs:
            row = r_row(outs.get(k, NA("missing", "the causal efficiency did not run")), "fwd", c)
            for block in TRACE_BLOCKS:
                table.add(*trace_row([k, str(c), block], row, block, dict(kernel=k, c=c)))
    return table


TRACE_KEYS = ("ctas", "slots", "span_us", "fill", "drain_us", "tiles", "cycles_per_tile",
              "fixed_cycles", "fixed_tiles", "ghz",
              "start_cycles", "loop_fixed_cycles", "end_cycles")   # the last three: None from an older bench


def trace_row(first, row, block, data):
    """A CTA timeline table's row: the cells `first`, then the trace of
    `block` in bench/blocks' (r) row (or its NA), and its data."""
    t = row if is_na(row) else row.get("trace", {}).get(block)
    if t is None:
        t = NA("no trace", "bench/blocks printed no trace")
    elif not is_na(t) and t["ctas"] == 0:
        t = NA("no CTA records", "only the CUDA mma and wgmma kernels keep them")
    v = {key: t if is_na(t) else t.get(key) for key in TRACE_KEYS}
    v = {key: NA("none") if x is None else x for key, x in v.items()}
    share = ratio(v["drain_us"], v["span_us"])
    cells = first + [(v["ctas"], ""), (v["slots"], ""), (v["span_us"], ".1f"), (v["fill"], ".3f"),
                     (v["drain_us"], ".1f"), (share, ".3f"), (v["tiles"], ""),
                     (v["cycles_per_tile"], ".0f"), (v["fixed_cycles"], ".0f"),
                     (v["fixed_tiles"], ".2f"), (v["ghz"], ".2f"), (v["start_cycles"], ".0f"),
                     (v["loop_fixed_cycles"], ".0f"), (v["end_cycles"], ".0f")]
    return cells, dict(data, block=block, drain_share=share, **v)


def table_trace_bwd(session):
    """The backward speed's blocks, where their time goes: the backward's CTA timelines."""
    header = ["kernel", "B,H,S,D", "block", "CTAs", "slots", "span us", "fill", "drain us",
              "drain share", "query tiles", "cycles / tile", "fixed cycles", "fixed / tile",
              "GHz", "start cycles", "loop fixed cycles", "end cycles"]
    table = Table("backward_trace", "backward CTA timelines: where a backward block's time "
                  "goes", "none (a diagnosis of the backward ring's cost)", header,
                  "The (r) --pass bwd blocks of the backward TFLOPS, each run once more by the "
                  "same command with --trace, as the causal efficiency's CTA timelines: a CTA per key tile (of 128 keys) "
                  "and kv head, its tiles the query tiles it visits (of 64 rows at D = 128, "
                  "128 at D = 64, times the GQA group's heads); fixed / tile = a CTA's fixed "
                  "cost in query tiles (from the causal block, whose CTAs visit different "
                  "numbers). The wgmma backward's marks split it: start = to its first tiles "
                  "(K, V, Q, dO) landed; loop fixed = the loop's own; end = after its last "
                  "query tile (dK and dV written); the mma backward does not mark. A c = 4096 "
                  "block is a ring step's; its fixed cost per query tile against the long "
                  "blocks' is the backward ring's extra work over one call.")
    outs = getattr(session, "bwd_outs", {})
    if not outs:
        table.add(["-", "-", "-"] + [NA("missing", "the backward TFLOPS did not run")] * 14,
                  {"result": NA("missing", "the backward TFLOPS did not run")})
    for (k, h, d), out in outs.items():
        for s_ in by_heads_dim(session.size["shapes"])[(h, d)]:
            row = r_row(out, "bwd", s_)
            for block in TRACE_BLOCKS:
                shape = f"1,{h},{s_},{d}"
                table.add(*trace_row([kernel_label(k, "bwd"), shape, block], row, block,
                                     dict(kernel=k, shape=[1, h, s_, d])))
    return table


def table_ring(session):
    """Ring balance and ring cost: the ring of P ranks on one device, from bench/blocks (p)."""
    h, d = session.size["r_h"], session.size["r_d"]
    kernels = session.args.kernels
    header = ["kernel", "c", "S", "order", "crit ms", "total ms", "ratio", "ceiling",
              "achieved", "vs 1 call", "b2b/call", "serial/call", "r at c", "F b2b",
              "F for 1.05", "balance", "cost"]
    table = Table("ring", "the ring on one device, forward",
                  f"balance: striped achieved >= {ACHIEVED_MIN} (ratio / ceiling) and ratio >= "
                  f"{RATIO_MIN} at c = {RATIO_AT_C}; cost: b2b/call <= {VS_ONE_CALL_MAX} "
                  f"at S = {VS_ONE_CALL_AT_S}", header,
                  f"build/bench/blocks section (p): P = {RING_P} ranks of c tokens, B = 1, "
                  f"H = {h}, D = {d}, bf16; every (rank, step) block alone on one device, "
                  "accumulating as the ring does. crit = sum over steps of the slowest "
                  "rank's block; ratio = contiguous crit / this order's; ceiling = "
                  "(r + P - 1) / (P r) with r measured at c; achieved = ratio / ceiling; "
                  "vs 1 call = all blocks' time, each alone on an idle device, / one causal "
                  "call on S = P c; b2b/call = the same blocks launched back to back (steps "
                  "in turn, as the ranks run them one after another on one GPU), timed as "
                  "one, / that call: the ring's cost; serial/call = the same without "
                  "dependent launches (--dependent 0); 'wgmma, rows' waits': the wgmma "
                  "kernel with --dependent 2 (a block waits for the counts of the rows it "
                  "merges, not for the block before; at the cost's c only). The tile model (bench/blocks (m): "
                  "K key tiles and V query tiles' visits of the blocks, and of the one call, "
                  "time as K + F V): F b2b = the cost of a visit beyond its key tiles, in key "
                  "tiles, that b2b/call implies; F for 1.05 = the largest F with which "
                  "b2b/call is at most 1.05 (below 0: none). PyTorch has no ring to compare "
                  "with.")
    outs = {}
    for c in session.size["ring_c"]:   # every kernel at the first c before the next c
        for k in kernels:
            outs[(k, c)] = run_blocks(session, table, k, "p", "fwd", h, d, [c],
                                      extra=("--trace",))
    session.ring_outs = outs   # for table_ring_trace
    # the wgmma forward with the rows' waits, at the cost's c (untraced)
    c3 = VS_ONE_CALL_AT_S // RING_P
    rows_label = "wgmma, rows' waits"
    runs = [(k, c, outs[(k, c)]) for k in kernels for c in session.size["ring_c"]]
    if "wgmma" in kernels and c3 in session.size["ring_c"]:
        runs.append((rows_label, c3, run_blocks(session, table, "wgmma", "p", "fwd", h, d, [c3],
                                                extra=("--dependent", "2"))))
    for k, c, out in runs:
        rows = rows_of(out, "p", "fwd")
        if is_na(rows) or not rows:
            na = rows if is_na(rows) else NA("missing", f"no (p) row for c = {c}")
            table.add([k, str(c), str(RING_P * c), "-"] + [na] * 13,
                      {"kernel": k, "c": c, "result": na})
            continue
        for row in rows:
            table.add(*ring_row(k, row))
    return table


def table_ring_groups(session):
    """The rings with a rank's steps grouped: bench/blocks (p) --group at
    the first ring c, a run of its own (a grouped ring that failed its
    check would otherwise take the ring's rows with it)."""
    header = ["kernel", "c", "order", "G", "taken", "launches", "K", "V", "b2b/call", "F b2b",
              "F busy", "wall / busy", "o err", "lse err"]
    c = session.size["ring_c"][0]
    table = Table("ring_groups", "the ring, steps grouped: fewer visits",
                  "none (the tile model's steps per launch, measured)", header,
                  f"bench/blocks (p) at c = {c} with --group {RING_GROUPS} for the wgmma kernel "
                  "(or the first of --kernels without it), as the ring's table runs it otherwise "
                  "(P, H, D, bf16): each order's forward ring once more with a "
                  "rank's steps grouped as the library groups them for "
                  "dt_attention_options.group = G (mask.h's rule), their keys one segment "
                  "(contiguous: the shards side by side; zigzag: the chunks nested, one jump; "
                  "striped: a power of two of blocks in slots read in turns, at positions that "
                  "keep the mask's every comparison; no launch crossing where a rank's sources "
                  "wrap from 0 to P - 1), timed back to back as b2b; G = 1 is the ring itself; "
                  "taken: the group the order takes. K, V: the tile model's "
                  "key tiles and query tiles' visits of its "
                  "blocks; F b2b: a visit's cost, in key tiles, that its b2b/call implies (the "
                  "same model as the ring's table); with --trace the b2b run once more as one device "
                  "timeline: F busy, the F its busy time over the one call's implies, and wall / "
                  "busy, its idle share where launches meet; o err, lse err: its outputs' largest "
                  "difference "
                  "from the ring's (bench/blocks fails past 1e-5 in fp32, 2e-2 in bf16 for o, "
                  "1e-4 for lse).")
    h, d = session.size["r_h"], session.size["r_d"]
    # the default kernel's (wgmma's where it is listed): a diagnosis, last
    kernels = [k for k in session.args.kernels if k == "wgmma"] or session.args.kernels[:1]
    for k in kernels:
        out = run_blocks(session, table, k, "p", "fwd", h, d, [c],
                         extra=("--group", RING_GROUPS, "--trace"))
        rows = rows_of(out, "p", "fwd")
        for order in ("contiguous", "striped", "zigzag"):
            row = None if is_na(rows) else next((r for r in rows if r["order"] == order), None)
            groups = rows if is_na(rows) else (row or {}).get("groups")
            if is_na(groups) or not groups:
                na = groups if is_na(groups) else NA("missing", "bench/blocks printed no groups")
                table.add([k, str(c), order, "-"] + [na] * 10,
                          {"kernel": k, "c": c, "order": order, "result": na})
                continue
            for g in groups:
                none = NA("none", "no tile model for this kernel (bench/blocks (m): mma and "
                          "wgmma)")
                no_records = NA("no CTA records", "only the CUDA mma and wgmma kernels keep "
                                "them") if "tiles" in g else none
                f = [g.get("f_b2b", none), g.get("f_busy", no_records)]
                f = [NA("none", "no F gives that ratio") if x is None else x for x in f]
                tl = g.get("b2b_timeline")
                wb = NA("no trace", "bench/blocks printed no timeline") if not tl else (
                    NA("no CTA records", "only the CUDA mma and wgmma kernels keep them")
                    if not tl["records"] or not tl["busy_ms"] else tl["wall_ms"] / tl["busy_ms"])
                cells = [k, str(c), order, str(g["G"]), str(g.get("group", "-")),
                         str(g["launches"]),
                         str(g.get("tiles", "-")), str(g.get("visits", "-")),
                         (g["b2b_vs_1_call"], ".3f"), (f[0], ".2f"), (f[1], ".2f"), (wb, ".3f"),
                         (g["o_err"], ".1e"), (g["lse_err"], ".1e")]
                table.add(cells, dict(g, kernel=k, c=c, order=order))
    return table


def ring_traces(session, key, single_key, pass_="fwd"):
    """(kernel, c, order, trace) for every traced (p) row of the ring's table
    (pass_ "bwd": the exposed communication's backward ring at P = RING_P), the rows' `key`
    object, and the one call's (`single_key`) after each c's rows; one row
    with order "-" and the NA where a run is missing."""
    if pass_ == "fwd":
        outs = getattr(session, "ring_outs", {})
        labels = session.args.kernels
        cs, missing = session.size["ring_c"], "the ring on one device did not run"
    else:
        outs = getattr(session, "bwd_ring_outs", {})
        labels = list(dict.fromkeys(k for k, _ in outs)) or bwd_choices(session.args.kernels)
        cs = sorted({c for _, c in outs}) or [session.size["ring_c"][0]]
        missing = "the exposed communication did not run"
    for k in labels:
        for c in cs:
            rows = rows_of(outs.get((k, c), NA("missing", missing)), "p", pass_)
            if is_na(rows) or not rows:
                yield k, c, "-", rows if is_na(rows) else NA("missing", f"no (p) row for c = {c}")
                continue
            for row in rows:
                yield k, c, row["order"], row.get(key)
            yield k, c, "one call", rows[0].get(single_key)


def trace_values(t, keys, count):
    """The figures `keys` of a trace object t, each the NA in its place where
    t is missing, has no record (its `count` 0) or a figure is null."""
    if t is None:
        t = NA("no trace", "bench/blocks printed no trace")
    elif not is_na(t) and t[count] == 0:
        t = NA("no CTA records", "only the CUDA mma and wgmma kernels keep them")
    v = {key: t if is_na(t) else t[key] for key in keys}
    return {key: NA("none") if x is None else x for key, x in v.items()}


def table_ring_trace(session):
    """The ring on one device, where its time goes: the launches of --trace summed."""
    header = ["kernel", "c", "order", "launches", "span ms", "drain ms", "drain share",
              "packed ms", "fill"]
    table = Table("ring_trace", "the ring, CTA timelines: its launches against one call",
                  "none (a diagnosis of the ring's cost)", header,
                  "The (p) runs of the ring's table with --trace: every block of the order run "
                  "once more, each of its launches' CTAs recording their start and end "
                  "(attention/cta_trace.h), summed over the launches: span (first CTA start "
                  "to last end), drain (last CTA start to the end: SMs going idle), packed "
                  "(the SMs' mean busy time: the span with no SM ever idle), "
                  "fill = packed / span; 'one call' is the causal call on the whole "
                  "sequence that the ring's cost compares with. packed ring / packed call is the "
                  "ring's extra work (each CTA's fixed cost, more CTAs of fewer tiles); "
                  "span / packed its idle time.")
    keys = ("launches", "ctas", "span_ms", "drain_ms", "packed_ms", "fill")
    for k, c, order, t in ring_traces(session, "trace", "single_trace"):
        v = trace_values(t, keys, "ctas")
        share = ratio(v["drain_ms"], v["span_ms"])
        table.add([k, str(c), order, (v["launches"], ""), (v["span_ms"], ".3f"),
                   (v["drain_ms"], ".3f"), (share, ".3f"), (v["packed_ms"], ".3f"),
                   (v["fill"], ".3f")], dict(kernel=k, c=c, order=order, drain_share=share, **v))
    return table


def table_ring_timeline(session, pass_="fwd"):
    """The ring back to back as one timeline: its extra work and its idle
    time against the one call's (pass_ "bwd": the exposed communication's
    backward ring at P = RING_P, against one backward call)."""
    header = ["kernel", "c", "order", "wall ms", "busy ms", "idle", "idle start ms",
              "idle between ms", "idle end ms", "busy / call's", "wall / busy"]
    if pass_ == "bwd":
        table = Table("exposed_bwd_timeline", f"exposed communication, one timeline: the "
                      f"backward ring (P = {RING_P}) back to back against one call", "none (a "
                      "diagnosis of the backward ring's cost)", header,
                      f"The exposed communication's bench/blocks (p) --pass bwd run at P = {RING_P} with --trace: "
                      "its 'no-copy' ring (every block of the backward ring, steps in turn, "
                      "back to back) run once more as one device timeline, as the ring's "
                      "'one timeline' does for the forward; 'one call' is the backward on the whole "
                      "sequence. busy / call's = the backward ring's extra work (each key "
                      "tile's fixed cost per block: the backward CTA timelines), wall / busy its "
                      "idle time; their product is about the blocks' b2b / one call.")
    else:
        table = Table("ring_timeline", "the ring, one timeline: back to back against one "
                      "call", "none (a diagnosis of the ring's cost)", header,
                      "The (p) runs of the ring's table with --trace: the b2b ring (every block, steps "
                      "in turn, back to back) run once more with each launch's CTAs recording their "
                      "start, end and SM, as one device timeline (attention/cta_trace.h): per SM "
                      "(the mean over the SMs) busy = running a record (a dependent launch's wait "
                      "for the launch before inside one included), idle before its first record, "
                      "between two and after its last; wall = first start to last end. 'one call' "
                      "is the causal call on the whole sequence that the ring's cost compares with. busy / "
                      "call's = the ring's extra work (each query tile's fixed cost per block), "
                      "wall / busy its idle time (launch boundaries, the last launch's drain); "
                      "their product is about b2b/call.")
    keys = ("records", "wall_ms", "busy_ms", "idle", "idle_start_ms", "idle_between_ms",
            "idle_end_ms")
    rows = [(k, c, order, trace_values(t, keys, "records"))
            for k, c, order, t in ring_traces(session, "b2b_timeline", "single_timeline", pass_)]
    calls = {(k, c): v for k, c, order, v in rows if order in ("one call", "-")}
    for k, c, order, v in rows:
        more = ratio(v["busy_ms"], calls[(k, c)]["busy_ms"])
        idle = ratio(v["wall_ms"], v["busy_ms"])
        table.add([k, str(c), order, (v["wall_ms"], ".3f"), (v["busy_ms"], ".3f"),
                   (v["idle"], ".3f"), (v["idle_start_ms"], ".3f"),
                   (v["idle_between_ms"], ".3f"), (v["idle_end_ms"], ".3f"), (more, ".3f"),
                   (idle, ".3f")],
                  dict(kernel=k, c=c, order=order, busy_vs_call=more, wall_vs_busy=idle, **v))
    return table


def ring_row(kernel, row):
    striped = row["order"] == "striped"
    if striped:
        m4 = mark(row, lambda x: x["achieved"] >= ACHIEVED_MIN and
                  (x["c"] != RATIO_AT_C or x["ratio"] >= RATIO_MIN))
    else:
        m4 = "-"
    b2b = row.get("b2b_vs_1_call")
    b2b = NA("none", "bench/blocks printed no back-to-back time") if b2b is None else b2b
    serial = row.get("b2b_serial_vs_1_call")
    serial = NA("none", "no dependent launches on this backend") if serial is None else serial
    m3 = mark(b2b, lambda x: x <= VS_ONE_CALL_MAX) if row["S"] == VS_ONE_CALL_AT_S else "-"
    model = row.get("model")
    if model is None:
        f = [NA("none", "no tile model for this kernel (bench/blocks (m): mma and wgmma)")] * 2
    else:
        f = [NA("none", "no F gives that ratio") if model.get(key) is None else model[key]
             for key in ("f_b2b", "f_for_1_05")]
    cells = [kernel, str(row["c"]), str(row["S"]), row["order"], (row["crit_ms"], ".3f"),
             (row["total_ms"], ".3f"), (row["ratio"], ".3f"), (row["ceiling"], ".3f"),
             (row["achieved"], ".3f"), (row["vs_1_call"], ".3f"), (b2b, ".3f"),
             (serial, ".3f"), (row["r"], ".3f"), (f[0], ".2f"), (f[1], ".2f"), m4, m3]
    data = dict(row, kernel=kernel, balance_mark=m4, cost_mark=m3)
    return cells, data


def table_waits(session):
    """Exposed communication of the ring, from bench/attention (b)
    with the copies and without them, and the ring's blocks alone from
    bench/blocks (p)."""
    kernels = session.args.kernels
    with_bwd = set(bwd_choices(kernels))
    header = ["kernel", "pass", "P", "order", "C", "wall ms", "b2b ms", "no-copy ms", "exposed",
              "mark", "blocks ms", "exposed (blocks)", "exposed (wall)", "kernels ms", "waits ms",
              "waits share", "before ms", "after ms"]
    table = Table("exposed", "exposed communication of the ring",
                  f"exposed <= {WAITS_MAX:.0%} of the step for C >= {WAITS_FROM_C} (marks only "
                  "there)", header,
                  "build/bench/attention section (b) with DT_ATTN_KERNEL=K: the causal "
                  "distributed call, P ranks (threads) sharing this device, local transport, "
                  "C tokens per rank; wall = the slowest rank's time of the call, a "
                  "read-back after it; b2b = the slowest rank's time per call of the same "
                  "calls enqueued one after another, one read-back after the last (a "
                  "pipeline's figure: a call's host work may overlap the call before). "
                  "Without the copies: no-copy ms = b2b of the same run with --copies 0 "
                  "(DT_LOCAL_COPIES=0: the local transport matches and completes every send "
                  "and receive but moves no data; the calls are otherwise the same). "
                  "exposed = (b2b - no-copy) / b2b: what the copies add to the calls, the "
                  "exposed communication; the mark is on it. The ring's "
                  "blocks alone: build/bench/blocks section (p) with the same P, C, H and D "
                  "runs every (rank, step) block of that ring back to back on this device, "
                  "timed as one; blocks ms = that time; exposed (blocks) = (b2b - blocks) / "
                  "b2b also counts the call's own work outside its blocks (the agreement, "
                  "the backward's zeroing, delta pass and stores), exposed (wall) = (wall - "
                  "blocks) / wall also each call's start on an idle device. They are "
                  "below 0 where ranks' kernels ran side by side. Also shown: kernels = sum "
                  "over steps of the slowest rank's block kernels and waits = the largest "
                  "per-rank sum of the gaps between one step's kernels and the next "
                  "(dt_attention_options.timing), share = waits / (kernels + waits): on one "
                  "shared device these gaps also hold the other ranks' kernels; of the call "
                  "outside them, before = the largest per-rank time from the call's start to "
                  "step 0's kernels (the agreement, the set-up, the backward's delta pass) and "
                  "after = the largest per-rank wait after the last step's kernels (the last "
                  "transfers and the stores; also in waits). auto's "
                  "backward is wgmma's, so its bwd rows come from the first kernel only. "
                  "\"wgmma, driver's copies\": the same calls with the communication stream's "
                  "work (the local transport's same-device copies, the backward's add beside) "
                  "by the driver's copy and kernels on as many SMs as they get (--comm-ctas "
                  + COMM_CTAS + "; by default kernels of at most "
                  "32 / P CTAs, the ranks sharing one GPU); blocks ms are the default's. "
                  "\"wgmma, persistent 2\": the wgmma forward persistent beside the ring's "
                  "copies too (--persistent 2, both benches; by default its blocks with a "
                  "copy in flight run a CTA per query tile, whose CTAs leave SMs to the "
                  "copy as their tiles end).")
    session.bwd_ring_outs = {}   # for table_ring_timeline(session, "bwd")
    # (kernel, passes, extra flags, label, whether the ring's blocks alone
    # are the kernel's default run's: flags bench/blocks does not take)
    variants = [(k, "fwd,bwd" if k in with_bwd else "fwd", (), k, False) for k in kernels]
    if "wgmma" in kernels:
        variants.append(("wgmma", "fwd,bwd", ("--comm-ctas", COMM_CTAS),
                         "wgmma, driver's copies", True))
        variants.append(("wgmma", "fwd", ("--persistent", "2"), "wgmma, persistent 2", False))
    base = {}   # kernel -> its default run's blocks alone
    for k, passes, extra, label, same_blocks in variants:
        n = len(session.commands)
        out = session.attention(k, "b", passes, extra)
        bare = session.attention(k, "b", passes, extra + ("--copies", "0"))
        table.commands += session.commands[n:]
        if is_na(out):
            table.add([label, passes, "-", "-", "-"] + [out] * 13, {"kernel": label, "result": out})
            continue
        rows = out.get("ring", [])
        # (pass, P, C, order) -> b2b ms without the copies
        without = bare if is_na(bare) else \
            {(r["pass"], r["P"], r["C"], r["order"]): r.get("b2b_ms") for r in bare.get("ring", [])}
        if same_blocks:
            alone = base.get(k, {})
        else:
            alone = {}   # (pass, P, C) -> {order: b2b ms} from bench/blocks (p)
            for key in sorted({(r["pass"], r["P"], r["C"], r["H"], r["D"]) for r in rows}):
                pass_, p, c, h, d = key
                # the backward ring of RING_P also traced: its one timeline
                traced = pass_ == "bwd" and p == RING_P
                got = run_blocks(session, table, k, "p", pass_, h, d, [c], ranks=p,
                                 extra=extra + (("--trace",) if traced else ()))
                if traced:
                    session.bwd_ring_outs[(bwd_kernel(k), c)] = got
                got_rows = rows_of(got, "p", pass_)
                alone[key[:3]] = got_rows if is_na(got_rows) else \
                    {x["order"]: x.get("b2b_ms") for x in got_rows if x["c"] == c}
            if not extra:
                base[k] = alone
        for row in rows:
            a = alone.get((row["pass"], row["P"], row["C"]))
            w = without if is_na(without) else \
                without.get((row["pass"], row["P"], row["C"], row["order"]))
            table.add(*waits_row(k, row, a, w, label))
    return table


def optional(row, key):
    """row[key], or an NA where the bench (an older build) printed none."""
    return row[key] if key in row else NA("none", f"the bench printed no {key}")


def waits_row(kernel, row, alone, without, variant=None):
    """One (b) row beside the same calls' b2b time without the copies
    (`without`: ms, or the NA of the run that should have given it) and its
    blocks' time alone (a {order: ms} dict, or an NA); variant: the
    kernel's label where the runs had extra flags."""
    if is_na(alone):
        blocks = alone
    elif alone is None or alone.get(row["order"]) is None:
        blocks = NA("missing", "no bench/blocks (p) b2b time for this order")
    else:
        blocks = alone[row["order"]]
    no_copy = NA("missing", "no --copies 0 time for this row") if without is None else without
    b2b = row.get("b2b_ms")
    b2b = NA("none", "bench/attention printed no back-to-back time") if b2b is None else b2b
    exposed = first_na(no_copy, b2b) or (b2b - no_copy) / b2b
    exposed_blocks = first_na(blocks, b2b) or (b2b - blocks) / b2b
    exposed_wall = first_na(blocks) or (row["wall_ms"] - blocks) / row["wall_ms"]
    m = mark(exposed, lambda x: x <= WAITS_MAX) if row["C"] >= WAITS_FROM_C else "-"
    step = row["steps_crit_ms"] + row["waits_max_ms"]
    share = row["waits_max_ms"] / step if step > 0 else NA("no step time")
    label = variant if variant and variant != kernel else kernel_label(kernel, row["pass"])
    cells = [label, row["pass"], str(row["P"]), row["order"], str(row["C"]),
             (row["wall_ms"], ".3f"), (b2b, ".3f"), (no_copy, ".3f"), (exposed, ".1%"), m,
             (blocks, ".3f"), (exposed_blocks, ".1%"), (exposed_wall, ".1%"),
             (row["steps_crit_ms"], ".3f"), (row["waits_max_ms"], ".3f"),
             (share, ".1%"), (optional(row, "before_max_ms"), ".3f"),
             (optional(row, "after_max_ms"), ".3f")]
    data = dict(row, kernel=kernel, label=label, no_copy_ms=no_copy, exposed=exposed,
                blocks_ms=blocks, exposed_blocks=exposed_blocks, exposed_wall=exposed_wall,
                waits_share=share, mark=m)
    return cells, data


def table_api(session):
    """The forward through the public API: bench/attention (a), bf16, per kernel."""
    header = ["kernel", "B,H,S,D", "mask", "ms", "TFLOPS", "FA2", "/ FA2"]
    table = Table("forward_api", "forward through the public API: dt_attention_forward, bf16",
                  f"dtensor >= {FWD_VS_FA2}x FA2", header,
                  "build/bench/attention section (a) --dtype bf16 with DT_ATTN_KERNEL=K: one "
                  "single-device dt_attention_forward call (one block, which starts and "
                  "finishes the rows), a "
                  "read-back after it; median after 1 warm-up. FA2: as in the forward TFLOPS (the same "
                  "measurement where the shape is the same).")
    torch = {}
    for k in session.args.kernels:
        n = len(session.commands)
        out = session.attention(k, "a", "fwd", ("--dtype", "bf16"))
        table.commands += session.commands[n:]
        if is_na(out):
            table.add([k, "-", "-"] + [out] * 4, {"kernel": k, "result": out})
            continue
        for row in out.get("kernel", []):
            if row["dtype"] != "bf16" or row["pass"] != "fwd":
                continue
            shape = (row["B"], row["H"], row["S"], row["D"])
            if shape not in torch:
                torch[shape] = session.torch.cases(shape, "fwd", table)
            fa2 = torch_value(torch[shape][("flash", row["causal"])], "tflops")
            vs = ratio(row["tflops"], fa2)
            table.add([k, ",".join(map(str, shape)), "causal" if row["causal"] else "none",
                       (row["median_ms"], ".3f"), (row["tflops"], TF), (fa2, TF),
                       with_mark(vs, lambda x: x >= FWD_VS_FA2)],
                      dict(row, kernel=k, FA2_tflops=fa2, vs_FA2=vs,
                           mark=mark(vs, lambda x: x >= FWD_VS_FA2)))
    return table


# ----------------------------------------------------------------- the run

def machine():
    """GPU (nvidia-smi), CPU model and cores, OS."""
    parts = []
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        gpus = [ln.strip() for ln in p.stdout.splitlines() if ln.strip()]
        parts.append("GPU " + "; ".join(gpus) if p.returncode == 0 and gpus
                     else "no GPU (nvidia-smi found none)")
    except (OSError, subprocess.SubprocessError):
        parts.append("no GPU (no nvidia-smi)")
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f
                          if ln.startswith("model name")), model)
    except OSError:
        pass
    parts.append(f"CPU {model}, {os.cpu_count()} cores")
    parts.append(f"{platform.system()} {platform.release()}")
    return "; ".join(parts)


def commit():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    return head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")


def header_lines(session, info):
    a = session.args
    return [
        "# dtensor attention report (bench/attention_report.py)", "",
        f"- date: {info['date']}",
        f"- machine: {info['machine']}",
        f"- dtensor: commit {info['commit']}, build dir {a.build}, backend {a.backend}, "
        f"kernels {', '.join(a.kernels)}",
        f"- torch: {session.torch.about}",
        f"- command: `{info['command']}`",
        f"- iterations: {session.iters} (dtensor after 1 warm-up; torch after "
        f"{session.size['warmup']}), medians; budget {a.budget:.0f} s, each step under a "
        f"{a.step_timeout:.0f} s timeout",
    ] + (["- --quick: tiny shapes, a smoke test: no figure or mark here says anything "
          "about the kernels' speed"] if a.quick else []) + \
        (["- --backend cpu: the CPU kernels run whatever --kernels says"]
         if a.backend == "cpu" else []) + [""]


def summary_lines(session, tables):
    counts = {}
    for s in session.steps:
        counts[s["status"]] = counts.get(s["status"], 0) + 1
    lines = ["## summary", ""]
    lines += [f"- {t.title.split(':')[0]}: {t.marks()['PASS']} PASS, {t.marks()['FAIL']} FAIL"
              for t in tables]
    lines += ["- steps: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
             f"- elapsed: {time.monotonic() - session.start:.0f} s of --budget "
             f"{session.args.budget:.0f} s"]
    lines += [f"- {s['status']}: {s['command']}" + (f" ({s['detail']})" if s.get("detail")
                                                      else "")
              for s in session.steps if s["status"] not in ("ok",)]
    return lines + [""]


def emit(session, text):
    if not session.args.json:
        print(text, flush=True)


def parse_kernels(text):
    names = [k for k in text.split(",") if k]
    if not names or any(k not in KERNELS for k in names):
        raise argparse.ArgumentTypeError(f"takes a list of {', '.join(KERNELS)}; got '{text}'")
    return list(dict.fromkeys(names))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.relpath(os.path.join(ROOT, "build")),
                    help="the build directory with bench/blocks and bench/attention")
    ap.add_argument("--kernels", type=parse_kernels, default=["mma", "wgmma"],
                    help="DT_ATTN_KERNEL choices to measure (default mma,wgmma)")
    ap.add_argument("--iters", type=int, default=0,
                    help="timed repetitions, median (default 10; 2 with --quick)")
    ap.add_argument("--budget", type=float, default=450.0,
                    help="seconds for the whole run; later steps are skipped (and said so) "
                         "when it runs out (default 450)")
    ap.add_argument("--step-timeout", type=float, default=STEP_TIMEOUT_S, metavar="SECONDS",
                    help="the longest one bench may run before it is killed and its launch "
                         f"(kernel and variant flags) counted as hung (default {STEP_TIMEOUT_S:.0f})")
    ap.add_argument("--json", action="store_true", help="print one JSON object, no tables")
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON object to FILE")
    ap.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test")
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--no-torch", action="store_true", help="no PyTorch columns")
    args = ap.parse_args(argv)
    if args.iters < 0 or args.iters > 100:
        ap.error("--iters takes 1 to 100")
    if args.budget <= 0:
        ap.error("--budget takes a positive number of seconds")
    if args.step_timeout <= 0:
        ap.error("--step-timeout takes a positive number of seconds")
    if args.backend == "cpu" and not args.quick:
        ap.error("--backend cpu runs the reference shapes for hours: add --quick")
    for name in ("blocks", "attention"):
        path = os.path.join(args.build, "bench", name)
        if not os.access(path, os.X_OK):
            ap.error(f"{path} is not built (run make, or give --build DIR)")
    return args


def main(argv):
    args = parse_args(argv)
    session = Session(args)
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "machine": machine(), "commit": commit(),
            "command": shlex.join(["python3", os.path.relpath(__file__)] + argv)}
    emit(session, "\n".join(header_lines(session, info)))
    tables = []
    # the open targets first (the module's docstring)
    for make in (lambda: table_r(session), lambda: table_trace(session),
                 lambda: table_ring(session), lambda: table_ring_trace(session),
                 lambda: table_ring_timeline(session),
                 lambda: table_waits(session), lambda: table_ring_timeline(session, "bwd"),
                 lambda: table_throughput(session, "fwd"), lambda: table_throughput(session, "bwd"),
                 lambda: table_trace_bwd(session), lambda: table_api(session),
                 lambda: table_ring_groups(session)):
        tables.append(make())
        emit(session, tables[-1].markdown())
    emit(session, "\n".join(summary_lines(session, tables)))
    failed = [s for s in session.steps if s["status"].startswith("failed")
              or s["status"] == "timed out"]
    result = dict(info, bench="attention_report", build=args.build, backend=args.backend,
                  kernels=args.kernels, iters=session.iters, quick=args.quick,
                  budget_s=args.budget, elapsed_s=round(time.monotonic() - session.start, 1),
                  torch=session.torch.about, tables={t.key: t.json() for t in tables},
                  torch_rows=session.torch.rows, steps=session.steps,
                  complete=not failed)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
