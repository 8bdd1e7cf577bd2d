#!/usr/bin/env bash
# scripts/gpu_check.sh — what one device call on a GPU machine should learn,
# in a few minutes: the machine, the build, the CUDA-relevant suites one by
# one, compute-sanitizer (memcheck on test_cuda; racecheck and synccheck on
# the tensor-core attention kernels), the examples on --backend cuda, the
# benches' --quick runs (bench/attention_report.py's too), and last the whole
# `make test`.
#
#   scripts/gpu_check.sh [--dry-run] [--skip GROUPS] [--prebuilt DIR] [BUDGET_SECONDS]
#
#   BUDGET_SECONDS  wall-clock budget for the whole run (default 540: a device
#                   call may run 600 s). Every step runs under `timeout` with
#                   its own cap, trimmed to what is left; a step that no
#                   longer fits is recorded as skipped, never started.
#   --dry-run       print the steps (caps and commands) and run nothing.
#   --skip GROUPS   comma-separated groups to leave out, for a second call:
#                   env, build, tests, maketest, sanitizer, examples, bench.
#   --prebuilt DIR  run the programs of DIR (bench/, tests/, examples/, as
#                   scripts/gpu_pack.sh makes them on the machine you work
#                   from) instead of building: no build step (it checks
#                   that they load), and run_tests.sh DIR/tests instead of
#                   `make test` last.
#
# Output goes to $OUT (the device tool's folder that comes back; default
# ./gpu_check_out), three files (the device tool brings back eight):
# logs.tgz with one log per step (NN-name.log, packed again as each step
# ends), summary.txt with one line per step ("step rc seconds note",
# written as each step ends, so a run cut short still leaves one), and
# failures.txt with the telling lines of every step that failed. The script continues past failures and exits 0 when every
# step that ran passed, 1 otherwise.
#
# Dependencies: the device machine has CUDA and NCCL but no cmocka. Carry a
# prefix of unpacked .debs at .deps/root/usr (DEPS_PREFIX overrides it): it is
# passed as CMOCKA_ROOT (and as OPENBLAS_ROOT when it holds OpenBLAS), with
# DEPS=0 so make never tries a package manager. See scripts/README.md for
# how to make the prefix and the device call.
set -u -o pipefail

usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; }

dry=0
budget=540
skip=","
prebuilt=""
while [ $# -gt 0 ]; do
    case $1 in
    -n | --dry-run) dry=1 ;;
    --skip)
        [ $# -ge 2 ] || { echo "gpu_check: --skip needs a list" >&2; exit 2; }
        skip=",$2,"
        shift
        ;;
    --prebuilt)
        [ $# -ge 2 ] && [ -d "$2" ] || { echo "gpu_check: --prebuilt needs a directory" >&2; exit 2; }
        prebuilt=$2
        shift
        ;;
    -h | --help) usage; exit 0 ;;
    '' | *[!0-9]*) echo "gpu_check: unknown argument '$1' (--help)" >&2; exit 2 ;;
    *) budget=$1 ;;
    esac
    shift
done

cd "$(dirname "$0")/.." || exit 2
root=$PWD
out=${OUT:-$root/gpu_check_out}
build=${prebuilt:-build}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
jobs=${JOBS:-16}

# Build variables: the carried prefix, if there is one.
prefix=${DEPS_PREFIX:-$root/.deps/root/usr}
make_vars=(DEPS=0)
if [ -d "$prefix" ]; then
    # A carried copy may have lost the packages' symlinks (lib.so ->
    # lib.so.N), and -lcmocka needs the plain name.
    if [ "$dry" = 0 ]; then
        find "$prefix" -name 'lib*.so.*' 2>/dev/null | while read -r f; do
            base=${f%%.so.*}.so
            [ -e "$base" ] || ln -s "$(basename "$f")" "$base" 2>/dev/null || true
        done
    fi
    if find "$prefix" -name 'libcmocka.so*' 2>/dev/null | grep -q .; then
        make_vars+=("CMOCKA_ROOT=$prefix")
    fi
    if find "$prefix" -name 'libopenblas*.so*' 2>/dev/null | grep -q .; then
        make_vars+=("OPENBLAS_ROOT=$prefix")
    fi
    # The Makefile puts the prefix in every binary's rpath; this is for
    # anything that reaches the libraries another way.
    for d in "$prefix/lib" "$prefix/lib/$(uname -m)-linux-gnu"; do
        [ -d "$d" ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    export LD_LIBRARY_PATH
fi

# Library and NCCL logging for every step: the backend/transport choice (and
# NCCL's version line and warnings) land in each log.
export DT_LOG=${DT_LOG:-info}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export CMOCKA_MESSAGE_OUTPUT=STDOUT

if [ "$dry" = 0 ]; then
    mkdir -p "$out" || exit 2
    logs=$(mktemp -d) || exit 2
    summary=$out/summary.txt
    failures=$out/failures.txt
    # The checkout's commit (a device copy may carry older git metadata than
    # its files: the programs' own record, gpu_pack.sh's COMMIT, says more).
    what="tree $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
    [ -n "$prebuilt" ] && what+=", programs $(paste -sd' ' "$build/COMMIT" 2>/dev/null || echo '?')"
    printf '# gpu_check %s, budget %ss, %s\n# step rc seconds note\n' "$what" "$budget" \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$summary"
    : >"$failures"
fi

n=0
any_failed=0

skipped() { case $skip in *",$1,"*) return 0 ;; esac; return 1; }

record() { # record NAME RC SECONDS NOTE
    printf '%-34s %-5s %4s  %s\n' "$1" "$2" "$3" "$4" | tee -a "$summary"
}

# cmocka's per-test lines, counted: "ok N failed N skipped N". Failed and
# skipped names are printed twice (again under "N test(s), listed below:"),
# so the headers' N is taken off, as tests/run_tests.sh does.
test_counts() {
    local ok fail skipn
    ok=$(grep -cE '^\[       OK \] ' "$1")
    fail=$(($(grep -cE '^\[  FAILED  \] [^0-9]' "$1") - $(listed "$1" FAILED)))
    skipn=$(($(grep -cE '^\[  SKIPPED \] [^0-9]' "$1") - $(listed "$1" SKIPPED)))
    printf 'ok %s failed %s skipped %s' "$ok" "$fail" "$skipn"
}
listed() { # listed LOG WORD: sum of N over "[  WORD  ] N test(s), listed below:"
    grep -E "^\[ *$2 *\] [0-9]+ test\(s\), listed below:" "$1" |
        sed -E 's/^[^0-9]*([0-9]+).*/\1/' | awk '{ s += $1 } END { print s + 0 }'
}

# The lines of a failed step's log worth reading first.
excerpt() { # excerpt NAME RC LOG
    {
        echo "=== $1 (rc $2): $3"
        grep -nE 'FAILED|[Ee]rror|DT_ERR_|mismatch|expected|illegal|misaligned|out of bounds|Invalid|NCCL WARN|timed out|Aborted|Segmentation' \
            "$3" | head -n 12
        echo "--- last lines"
        tail -n 8 "$3"
        echo
    } >>"$failures"
}

# step GROUP NAME CAP MIN KIND CMD...: run CMD under `timeout` for at most
# CAP seconds (less if the budget has less left, keeping 5 s in hand); skip
# it when fewer than MIN seconds are left. KIND: plain, cmocka (counts the
# cmocka results) or maketest (reads run_tests.sh's last line).
step() {
    local group=$1 name=$2 cap=$3 min=$4 kind=$5
    shift 5
    n=$((n + 1))
    local tag
    tag=$(printf '%02d-%s' "$n" "$name")
    if skipped "$group"; then
        [ "$dry" = 1 ] && printf '%-34s (skipped: --skip %s)\n' "$tag" "$group"
        [ "$dry" = 0 ] && record "$tag" skip 0 "--skip $group"
        return 0
    fi
    if [ "$dry" = 1 ]; then
        printf '%-34s cap %4ss  %s\n' "$tag" "$cap" "$*"
        return 0
    fi
    local left=$((budget - SECONDS - 5))
    [ "$cap" -gt "$left" ] && cap=$left
    if [ "$cap" -lt "$min" ]; then
        record "$tag" skip 0 "budget: ${left}s left, needs ${min}s"
        return 0
    fi
    # The program (after `env VAR=...`): missing means the build failed, or
    # for compute-sanitizer that this machine has none.
    local prog=$1 a
    if [ "$prog" = env ]; then
        for a in "$@"; do
            case $a in env | *=*) ;; *) prog=$a; break ;; esac
        done
    fi
    if [ ! -x "$prog" ] && ! command -v "$prog" >/dev/null 2>&1; then
        if [ "$group" = sanitizer ]; then
            record "$tag" skip 0 "no compute-sanitizer on this machine"
        else
            record "$tag" 127 0 "missing: $prog (did the build fail?)"
            any_failed=1
        fi
        return 0
    fi
    local log=$logs/$tag.log t0=$SECONDS rc
    echo "\$ $*" >"$log"
    timeout -k 5 "$cap" "$@" >>"$log" 2>&1
    rc=$?
    local secs=$((SECONDS - t0)) note=""
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && note="TIMED OUT after ${cap}s; "
    case $kind in
    cmocka) note+=$(test_counts "$log") ;;
    maketest) note+=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1) ;;
    esac
    record "$tag" "$rc" "$secs" "$note"
    if [ "$rc" != 0 ]; then
        any_failed=1
        excerpt "$tag" "$rc" "$log"
    fi
    pack_logs
}

# Every log so far into $OUT/logs.tgz: a run cut short keeps what it logged.
pack_logs() { tar czf "$out/logs.tgz" -C "$logs" . 2>/dev/null; }

# --------------------------------------------------------------- the machine
env_report() {
    echo "== host: $(uname -srm), $(nproc) cores"
    echo "== nvidia-smi"
    nvidia-smi || echo "(nvidia-smi failed: rc $?)"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap,persistence_mode \
        --format=csv 2>&1
    echo "== nvcc"
    "$cuda_home/bin/nvcc" --version 2>&1 | tail -n 2
    echo "== NCCL"
    local h
    for h in "$cuda_home/include/nccl.h" /usr/include/nccl.h; do
        [ -f "$h" ] && grep -E '^#define NCCL_(MAJOR|MINOR|PATCH|SUFFIX)' "$h" | sed "s|^|$h: |"
    done
    ldconfig -p 2>/dev/null | grep -E 'libnccl\.so|libcublas\.so|libcudart\.so' || true
    ls -l "$cuda_home"/lib64/libnccl.so* 2>/dev/null || true
    echo "== compute-sanitizer: $(command -v compute-sanitizer || echo "$sanitizer")"
    echo "== make variables: ${make_vars[*]}"
    echo "== LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    return 0
}

sanitizer=$(command -v compute-sanitizer 2>/dev/null ||
    ls "$cuda_home"/bin/compute-sanitizer "$cuda_home"/compute-sanitizer/compute-sanitizer 2>/dev/null |
    head -n 1)
sanitizer=${sanitizer:-compute-sanitizer}

if [ "$dry" = 1 ]; then
    echo "gpu_check dry run: budget ${budget}s, logs would go to $out"
    echo "make variables: ${make_vars[*]}; DT_LOG=$DT_LOG NCCL_DEBUG=$NCCL_DEBUG"
fi

if [ "$dry" = 0 ] && ! skipped env; then
    env_report >"$logs/00-env.log" 2>&1
    nvidia-smi -L >/dev/null 2>&1
    record 00-env "$?" "$SECONDS" "rc of nvidia-smi -L; see 00-env.log"
    pack_logs
    # The lines that identify the machine, for the device tool's output tail.
    grep -E '^== host|NVIDIA|release|NCCL_(MAJOR|MINOR|PATCH) ' "$logs/00-env.log" | head -n 12
fi
[ "$dry" = 1 ] && printf '%-34s cap %4ss  %s\n' "00-env" 10 "nvidia-smi, nvcc --version, nccl.h version, libraries"

# ------------------------------------------------------------------- build
if [ -n "$prebuilt" ]; then
    # Programs built elsewhere: do they find their libraries here?
    step build prebuilt_loads 20 5 plain bash -c "cat $build/COMMIT 2>/dev/null;
        ! ldd $build/tests/* $build/bench/* $build/examples/* | grep -B20 'not found'"
else
    step build build 300 30 plain make -j"$jobs" "${make_vars[@]}"
fi
if [ "$dry" = 0 ] && [ -z "$prebuilt" ] && [ -f "$logs/$(printf '%02d' "$n")-build.log" ]; then
    # What the Makefile found (CUDA, cuBLAS, NCCL, MPI, cmocka) and built.
    sed -n '/configuration/,/^$/p' "$logs/$(printf '%02d' "$n")-build.log" | head -n 16
fi

# -------------------------------------------- the CUDA-relevant suites first
step tests test_cuda 150 20 cmocka "$build/tests/test_cuda"
step tests test_attention 120 20 cmocka "$build/tests/test_attention"
step tests test_attention_backward 120 20 cmocka "$build/tests/test_attention_backward"
step tests test_context 60 10 cmocka "$build/tests/test_context"
step tests test_collectives 90 15 cmocka "$build/tests/test_collectives"
step tests test_ring 90 15 cmocka "$build/tests/test_ring"
step tests test_mlp 90 15 cmocka "$build/tests/test_mlp"
step tests test_transformer 120 20 cmocka "$build/tests/test_transformer"
step tests test_examples 120 20 cmocka "$build/tests/test_examples"
# The same suite with the examples it runs on the CUDA backend (the suites
# run them on the CPU unless DT_EXAMPLE_BACKEND says otherwise).
step tests test_examples_on_cuda 120 20 cmocka env DT_EXAMPLE_BACKEND=cuda "$build/tests/test_examples"
step tests test_reliability 150 20 cmocka "$build/tests/test_reliability"

# -------------------------------------------------------- sanitizers
# --report-api-errors no: NCCL asks cudaFuncGetAttributes about kernels it
# has no image for on this device and takes error 209 as the answer; memcheck
# would count each as an error (40 on an H100, 2026-11-22). dtensor checks
# every CUDA call's status itself, and test_cuda asserts those paths.
step sanitizer memcheck_test_cuda 120 30 plain "$sanitizer" --tool memcheck --error-exitcode 99 \
    --report-api-errors no --print-limit 40 "$build/tests/test_cuda"
# The tensor-core kernels (run before only on the CPU emulator, tests/emu):
# shared-memory races and barrier misuse, on their one-rank cases.
for tool in racecheck synccheck; do
    step sanitizer "${tool}_mma_fwd" 90 20 plain env DT_TEST_FILTER='forward/cuda-kernels/*P=1*' \
        "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 40 "$build/tests/test_attention"
    step sanitizer "${tool}_mma_bwd" 90 20 plain env DT_TEST_FILTER='backward/cuda-kernels/*P=1*' \
        "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 40 \
        "$build/tests/test_attention_backward"
done

# ------------------------------------------------- the examples on CUDA
# With one GPU: 4 ranks share it (cuda+local); --ranks 1 takes cuda+nccl.
ex=$build/examples
export DT_TIMEOUT_MS=${DT_TIMEOUT_MS:-60000}
step examples striped_attention 60 10 plain "$ex/striped_attention" --backend cuda
step examples striped_attention_bwd 60 10 plain "$ex/striped_attention" --backend cuda --backward
step examples striped_attention_bf16 60 10 plain "$ex/striped_attention" --backend cuda --dtype bf16 --backward
step examples striped_attention_fp16 60 10 plain "$ex/striped_attention" --backend cuda --dtype fp16
step examples striped_attention_zigzag 60 10 plain "$ex/striped_attention" --backend cuda --order zigzag --ranks 3 --seq 384
step examples striped_attention_nccl1 60 10 plain "$ex/striped_attention" --backend cuda --ranks 1
step examples tensor_parallel_mlp 60 10 plain "$ex/tensor_parallel_mlp" --backend cuda
step examples tensor_parallel_mlp_sp_bf16 60 10 plain "$ex/tensor_parallel_mlp" --backend cuda --sp --dtype bf16
step examples tensor_parallel_mlp_fp16 60 10 plain "$ex/tensor_parallel_mlp" --backend cuda --dtype fp16
step examples transformer_block 90 10 plain "$ex/transformer_block" --backend cuda
step examples transformer_block_sweep 90 15 plain "$ex/transformer_block" --backend cuda --sweep
step examples transformer_block_fp16 90 10 plain "$ex/transformer_block" --backend cuda --dtype fp16 --embed 512

# ------------------------------------------------------------------ bench
step bench bench_attention_quick 120 15 plain "$build/bench/attention" --backend cuda --quick
step bench bench_blocks_quick 60 10 plain "$build/bench/blocks" --backend cuda --quick
step bench bench_blocks_quick_wgmma 60 10 plain "$build/bench/blocks" --backend cuda --quick --kernel wgmma
step bench bench_mlp 120 20 plain "$build/bench/mlp" --backend cuda --ranks 1,2 --iters 10
# The GPU report on tiny shapes, PyTorch included where it is installed:
# checks every path of the measuring call (bench/attention_report.py).
step bench attention_report_quick 150 20 plain python3 bench/attention_report.py --quick --budget 120 --build "$build"

# -------------------------------------------------------- the whole suite
# Last: the suites above already ran the CUDA cases; this catches the rest
# with what the budget leaves (bounded per binary).
mt_cap=$((budget - SECONDS - 10))
[ "$dry" = 1 ] && mt_cap=300
[ "$mt_cap" -gt 300 ] && mt_cap=300
if [ -n "$prebuilt" ]; then
    step maketest run_tests "$mt_cap" 150 maketest env DT_TEST_TIMEOUT=120 bash tests/run_tests.sh \
        "$build/tests"
else
    step maketest make_test "$mt_cap" 150 maketest env DT_TEST_TIMEOUT=120 make test "${make_vars[@]}"
fi

if [ "$dry" = 1 ]; then
    echo "summary would be written to $out/summary.txt"
    exit 0
fi
pack_logs && rm -rf "$logs"
echo "== gpu_check done in ${SECONDS}s of ${budget}s; logs in $out/logs.tgz"
if [ -s "$failures" ]; then
    echo "== failures (first lines of each; full logs in $out/logs.tgz)"
    head -c 7000 "$failures"
fi
echo "== summary"
cat "$summary"
exit "$any_failed"
