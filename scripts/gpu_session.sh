#!/usr/bin/env bash
# scripts/gpu_session.sh — one device call that fits a GPU session of 15
# minutes of device time (the machine's start included): the packed
# programs' CUDA suites side by side, compute-sanitizer on the tensor-core
# attention kernels beside them (test_reliability after them, alone: its
# soak case reads the whole device's memory), a canary of the wgmma
# forward in its default launch (at D = 128 the producer warpgroup's
# loads) and with --producer 0 (thread 0's loads), and of the wgmma
# backward (a small block; a variant failing or hanging is left out of
# the rest, and if the default forward or the backward does, the rest
# measures the mma kernels only), the wgmma forward of the revisions that
# scripts/gpu_pack.sh --bisect packed beside this build's (if any), the
# ring cost (bench/attention (c); again with the communication stream's
# copies by the driver and its adds wide: --comm-ctas 0, without the
# copies: --copies 0, and the forward with its steps grouped: --group 4
# and 7), a ring step's copies alone (bench/ring, P = 2 and 8), then
# bench/attention_report.py with what is left of the budget. Every step
# before it is cut to leave it REPORT_MIN (200) seconds.
#
#   scripts/gpu_session.sh [--dry-run] [--profile] [--prebuilt DIR] [BUDGET_SECONDS]
#
#   BUDGET_SECONDS  the whole run (default 480). The suites and the
#                   sanitizers take about 45 s on an H200, the canaries
#                   about 8, the ring cost about 20 s each of its runs,
#                   --profile about 45 s, attention_report.py about 300 s
#                   (on an H200, 2026-11-27: with a budget of 317 s it ran
#                   54 steps in 299 s and skipped its last 6, for the
#                   budget; its tables added since take more; it runs the
#                   figures short of their targets first, and its later
#                   steps are skipped when the budget runs out). Give the
#                   device call a timeout_s of the budget plus 20: with a
#                   machine's start, about 9 of the session's 15 minutes,
#                   leaving room for a shorter second call.
#   --prebuilt DIR  the programs (default .gpu/build, as scripts/gpu_pack.sh
#                   makes them here; the call carries [".deps", ".gpu"]).
#   --profile       also Nsight Compute's source counters on the wgmma
#                   forward's causal 4096 x 4096 block (H = 32, D = 128,
#                   bf16), by default and with each variant, before
#                   attention_report.py (about 40 s, which it then lacks
#                   at a budget of 480): needs DIR/prof/blocks, a
#                   LINEINFO=1 build (scripts/gpu_pack.sh --profile); its
#                   exports come back in ncu_source.tgz and
#                   bench/ncu_source.py's summary, split at the tile loop,
#                   the key tile loop and the end, in summary.txt.
#   --dry-run       print what would run, run nothing.
#
# Output, in $OUT (at most 8 files, as the device tool brings back):
# summary.txt (one line per suite with its cmocka counts, each
# sanitizer's verdict, the ring cost's rows, the report's summary),
# tests.tgz (the suites' and sanitizers' logs), ring_cost.txt,
# attention_report.md, .json and .err (and ncu_source.tgz). Exits 0 when
# every suite, sanitizer and canary passed and the report ran whole, 1
# otherwise. scripts/gpu_check.sh is the thorough check (every suite one by
# one, the examples, the benches' --quick runs, the whole suite last:
# 540 s, a call of its own).
set -u

usage() { sed -n '2,55p' "$0" | sed 's/^# \{0,1\}//'; }
dry=0
profile=0
budget=480
build=.gpu/build
while [ $# -gt 0 ]; do
    case $1 in
    -n | --dry-run) dry=1 ;;
    --profile) profile=1 ;;
    --prebuilt)
        [ $# -ge 2 ] || { echo "gpu_session: --prebuilt needs a directory" >&2; exit 2; }
        build=$2
        shift
        ;;
    -h | --help) usage; exit 0 ;;
    '' | *[!0-9]*) echo "gpu_session: unknown argument '$1' (--help)" >&2; exit 2 ;;
    *) budget=$1 ;;
    esac
    shift
done

cd "$(dirname "$0")/.." || exit 2
out=${OUT:-$PWD/gpu_session_out}
suites="test_cuda test_attention test_attention_backward test_attention_docs_cuda test_attention_ulysses test_nonfinite test_grad test_grad_kernels test_train test_mlp test_transformer test_collectives test_ring test_reliability"
# compute-sanitizer on the one-rank cases of the kernel tests (every
# forward and backward kernel in both forms, cuda-kernels/ and
# cuda-latest/; the wgmma forward's variants at D = 128)
sanitized="racecheck:test_attention:forward racecheck:test_attention_backward:backward
synccheck:test_attention:forward synccheck:test_attention_backward:backward"
# the wgmma forward's launches that the canaries, the ring cost (but
# --producer 0: ring_runs_of) and --profile compare:
# the default (at D = 128 the producer warpgroup's loads) and --producer 0
# (thread 0's); each is its flags with '_' for the space
variants="default --producer_0"
flags_of() { [ "$1" = default ] || echo "${1//_/ }"; }   # the bench flags of a variant
# the ring cost once more with the default kernel launch: the communication
# stream's work (the local transport's same-device copies, the backward's
# add beside) by the driver's copy and kernels on as many SMs as they get
# instead of the default's kernels of a few CTAs, 32 shared by the ranks on
# the GPU (dt_backend_cuda_set_comm_ctas; the default since 2026-11-29);
# once with the local transport moving no data (--copies 0,
# DT_LOCAL_COPIES=0): the ring's cost without the same-device copies that
# ranks sharing one GPU add, which on a GPU per rank travel between GPUs
# (outputs wrong there); and the forward with its ring steps grouped 4 and
# 7 to a launch (--group, dt_attention_options.group; at P = 8 striped
# takes 4 for both, a power of two, and 7 is every step after a rank's
# own for contiguous and zigzag, where the tile model puts contiguous
# within 1.05x of one call). (--dependent 2, the rows' waits, was measured
# on 2026-11-29 and left off.)
ring_extra="--comm-ctas_0 --copies_0 --group_4_--pass_fwd --group_7_--pass_fwd"
# the ring cost's runs: the variants left (the canaries'), --producer 0
# aside (measured there twice on the H200 of 2026-11-27), then ring_extra
ring_runs_of() {
    local v out=""
    for v in "$@" $ring_extra; do
        [ "$v" = --producer_0 ] || out="$out $v"
    done
    echo "${out# }"
}
# A canary for each variant and the backward: a block small enough to
# take milliseconds, with more query tiles (256) than SMs, so that
# persistent CTAs take several. A variant failing or running past 20 s
# is left out of everything after it, where a hang would cost each step
# its timeout; attention_report.py runs the default launch only.
canary="--backend cuda --kernel wgmma --section r --heads 16 --kv-heads 16 --dim 128 --dtype bf16
--c 2048 --iters 1"
report_min=${REPORT_MIN:-200}

if [ "$dry" = 1 ]; then
    echo "gpu_session dry run: budget ${budget}s, programs of $build, output in $out"
    for t in $suites; do
        [ "$t" = test_reliability ] || echo "  suite      $build/tests/$t (140 s at most; side by side)"
    done
    for s in $sanitized; do
        IFS=: read -r tool t pass <<<"$s"
        echo "  sanitizer  DT_TEST_FILTER='$pass/cuda-*/*P=1*' compute-sanitizer --tool $tool $build/tests/$t"
    done
    echo "  then       $build/tests/test_reliability (140 s at most; alone)"
    for v in $variants --pass_bwd; do
        if [ "$v" = --pass_bwd ]; then f="--pass bwd"; else f=$(flags_of "$v"); f="--pass fwd${f:+ $f}"; fi
        # shellcheck disable=SC2086 # the flags, word by word
        echo "  canary     $build/bench/blocks" $canary $f "(20 s at most)"
    done
    [ -d "$build/bisect" ] && echo "  then       bench/blocks --kernel wgmma --section r, the D = 128 reference shapes, of each of:" \
        "$(cd "$build/bisect" && echo *) and this build (30 s at most each)"
    # shellcheck disable=SC2086 # the variants, word by word
    echo "  then       $build/bench/attention --backend cuda --section c --pass fwd,bwd --iters 5 with each of: $(ring_runs_of $variants | sed 's/_/ /g') (60 s at most each, less if attention_report.py would get under ${report_min} s)"
    echo "  then       $build/bench/ring --backend cuda --ranks P --mib 8,32 --iters 10 for P = 2, 8 (a ring step's same-device copies alone; 20 s at most in all)"
    [ "$profile" = 1 ] && echo "  then       ncu --section SourceCounters on $build/prof/blocks (the wgmma forward, causal 4096) with each of: ${variants//_/ } (likewise)"
    echo "  then       python3 bench/attention_report.py --build $build --budget <what is left - 15> --step-timeout <a third of it, 90 to 150> [--kernels mma] --json-out \$OUT/attention_report.json"
    exit 0
fi

[ -d "$build/tests" ] && [ -d "$build/bench" ] ||
    { echo "gpu_session: no programs in $build (run scripts/gpu_pack.sh here first)" >&2; exit 2; }
logs=$(mktemp -d)
mkdir -p "$out"
prefix=${DEPS_PREFIX:-$PWD/.deps/root/usr}
export LD_LIBRARY_PATH=$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CMOCKA_MESSAGE_OUTPUT=STDOUT DT_TIMEOUT_MS=60000 PYTHONUNBUFFERED=1
summary=$out/summary.txt
: >"$summary"
log() { echo "[$SECONDS s] $*" | tee -a "$summary"; }
ok=1

log "programs $(head -n 1 "$build/COMMIT" 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv,noheader 2>&1 | tee -a "$summary"
if ldd "$build"/tests/* "$build"/bench/* 2>/dev/null | grep -q 'not found'; then
    log "some programs do not load here:"
    ldd "$build"/tests/* "$build"/bench/* 2>/dev/null | grep 'not found' | sort -u | head -5 | tee -a "$summary"
    ok=0
fi

san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
declare -A rcs   # each log's exit status
pids=()
names=()
for t in $suites; do
    [ "$t" = test_reliability ] && continue
    timeout -k 5 140 "$build/tests/$t" >"$logs/$t.log" 2>&1 &
    pids+=($!)
    names+=("$t")
done
for s in $sanitized; do
    IFS=: read -r tool t pass <<<"$s"
    DT_TEST_FILTER="$pass/cuda-*/*P=1*" timeout -k 5 150 "$san" --tool "$tool" --error-exitcode 99 \
        --print-limit 20 "$build/tests/$t" >"$logs/${tool}_$t.log" 2>&1 &
    pids+=($!)
    names+=("${tool}_$t")
done
for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rcs[${names[$i]}]=$?
done
# alone: its soak case counts the whole device's memory in use
timeout -k 5 140 "$build/tests/test_reliability" >"$logs/test_reliability.log" 2>&1
rcs[test_reliability]=$?
count() { grep -c "$1" "$2"; }
# cmocka names a failed case twice (again under "listed below")
failures() { grep -E '^\[  FAILED  \] [a-z]' "$1" | sort -u; }
exited() { # exited NAME: its exit status, and whether timeout stopped it
    local rc=${rcs[$1]:-?}
    case $rc in 124 | 137) echo "exit $rc (timed out)" ;; *) echo "exit $rc" ;; esac
}
for t in $suites; do
    f=$logs/$t.log
    failed=$(failures "$f" | wc -l)
    passed=$(grep -q '^\[  PASSED  \]' "$f" && echo yes || echo no)
    skipped=$(grep '^\[  SKIPPED \] [a-z]' "$f" | sort -u | wc -l)
    log "$t: $(count '^\[       OK' "$f") ok, $failed failed, $skipped skipped, passed: $passed, $(exited "$t")"
    failures "$f" | head -5 | tee -a "$summary"
    [ "$failed" = 0 ] && [ "$passed" = yes ] || ok=0
done
for s in $sanitized; do
    IFS=: read -r tool t pass <<<"$s"
    f=$logs/${tool}_$t.log
    verdict=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -n 1)
    cases=$(count '^\[       OK' "$f")
    failed=$(failures "$f" | wc -l)
    log "$tool $t: ${verdict:-no summary} ($cases cases ok, $failed failed, $(exited "${tool}_$t"))"
    # a filter that ran no case proves nothing; a failed case is a failure
    echo "$verdict" | grep -qE ': 0 (errors|hazards)' && [ "$cases" -gt 0 ] && [ "$failed" = 0 ] || ok=0
done
kept=""
mma_only=0   # the default wgmma forward or the backward failed its canary
for v in $variants --pass_bwd; do
    if [ "$v" = --pass_bwd ]; then f="--pass bwd"; else f=$(flags_of "$v"); f="--pass fwd${f:+ $f}"; fi
    # shellcheck disable=SC2086 # the flags, word by word
    timeout -k 2 20 "$build/bench/blocks" $canary $f >"$logs/canary_${v#--}.log" 2>&1
    rc=$?
    log "canary $f: exit $rc"
    if [ "$rc" != 0 ]; then
        tail -n 3 "$logs/canary_${v#--}.log" | tee -a "$summary"
        ok=0
        case $v in
        default | --pass_bwd) mma_only=1 ;;
        esac
        continue
    fi
    [ "$v" = --pass_bwd ] || kept="$kept $v"
done
variants=$kept
if [ "$mma_only" = 1 ]; then
    log "the wgmma kernels failed a canary: the rest measures the mma kernels only"
    variants=""
fi
tar czf "$out/tests.tgz" -C "$logs" . && rm -rf "$logs"
# The wgmma forward of other revisions (scripts/gpu_pack.sh --bisect) beside
# this build's: the D = 128 reference shapes, each about 3 s
if [ -d "$build/bisect" ] && [ "$mma_only" = 0 ]; then
    echo "# the D = 128 reference blocks, the wgmma forward by revision (bench/blocks" \
        "--backend cuda --kernel wgmma --section r --pass fwd --heads 16 --kv-heads 16 --dim 128" \
        "--dtype bf16 --ranks 8 --c 4096,16384 --iters 10)" >>"$summary"
    for blocks in "$build"/bisect/*/blocks "$build/bench/blocks"; do
        rev=$(basename "$(dirname "$blocks")")
        [ "$rev" = bench ] && rev="$(head -n 1 "$build/COMMIT" 2>/dev/null) (this build)"
        echo "## $rev" >>"$summary"
        timeout -k 2 30 "$blocks" --backend cuda --kernel wgmma --section r --pass fwd --heads 16 \
            --kv-heads 16 --dim 128 --dtype bf16 --ranks 8 --c 4096,16384 --iters 10 2>&1 |
            tail -n +3 | head -n 8 >>"$summary"
        log "bisect: bench/blocks of $rev, exit ${PIPESTATUS[0]}"
    done
fi

# cap WANT: WANT seconds, or what the budget has left before the report's
# REPORT_MIN if that is less
cap() {
    local left=$((budget - SECONDS - 15 - report_min))
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
: >"$out/ring_cost.txt"
# shellcheck disable=SC2086 # the variants, word by word
ring_runs=$(ring_runs_of $variants)
[ "$mma_only" = 1 ] && ring_runs=mma
for v in $ring_runs; do
    c=$(cap 60)
    if [ "$c" -lt 15 ]; then
        log "ring cost ${v/_/ }: skipped, ${c}s left before attention_report.py's ${report_min}s"
        ok=0
        continue
    fi
    flag=$(flags_of "$v")
    kernel=auto
    [ "$v" = mma ] && flag="" && kernel=mma
    echo "# DT_ATTN_KERNEL=$kernel bench/attention --backend cuda --section c --pass fwd,bwd --iters 5 $flag" \
        >>"$out/ring_cost.txt"
    # shellcheck disable=SC2086 # the flag and its value, two words (none by default)
    DT_ATTN_KERNEL=$kernel timeout -k 5 "$c" "$build/bench/attention" --backend cuda --section c \
        --pass fwd,bwd --iters 5 $flag >>"$out/ring_cost.txt" 2>&1
    rcs[ring]=$?
    log "ring cost: DT_ATTN_KERNEL=$kernel bench/attention --section c${flag:+ $flag}, $(exited ring)"
done
# A ring step's copies alone: what the local transport's same-device copy
# of a rank's K|V costs (32 MiB at the ring cost's H = 16, D = 128, bf16),
# with nothing computing beside it (the exposed communication, the ring cost)
for P in 2 8; do
    c=$(cap 10)
    [ "$c" -lt 5 ] && { log "bench/ring --ranks $P: skipped, ${c}s left before attention_report.py's ${report_min}s"; continue; }
    echo "# bench/ring --backend cuda --ranks $P --mib 8,32 --iters 10" >>"$out/ring_cost.txt"
    timeout -k 5 "$c" "$build/bench/ring" --backend cuda --ranks "$P" --mib 8,32 --iters 10 \
        >>"$out/ring_cost.txt" 2>&1
    rcs[ring]=$?
    log "bench/ring --backend cuda --ranks $P: $(exited ring)"
done
grep -E '^ +[248] |^# |^\| [0-9]' "$out/ring_cost.txt" | tee -a "$summary"

# Where the wgmma forward's warps wait, per source line (bench/ncu_source.py)
if [ "$profile" = 1 ] && [ ! -x "$build/prof/blocks" ]; then
    log "--profile: no $build/prof/blocks (scripts/gpu_pack.sh --profile makes it)"
    ok=0
elif [ "$profile" = 1 ]; then
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    prof=$(mktemp -d)
    # ncu reads the sources from where they were built (scripts/gpu_pack.sh
    # wrote it down): point that path at this copy
    root=$(cat "$build/ROOT" 2>/dev/null)
    if [ -n "$root" ] && [ ! -e "$root" ]; then
        mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root"
    fi
    src=attention/cuda/wgmma_fwd.cu
    # the tile loop, the key tile loop and the end begin at these lines
    cuts=$(for pat in 'const uint32_t tile = next[ti ^ 1];' 'mbar_wait(&full[stage]' '        grid_dep_wait();'; do
        echo "attention/cuda/wgmma_fwd.cu:$(grep -nF -- "$pat" "$src" | tail -n 1 | cut -d: -f1)"
    done | paste -sd,)
    for v in $variants; do
        n=${v#--}   # default, producer_0
        c=$(cap 60)
        if [ "$c" -lt 20 ]; then
            log "ncu source counters, ${v/_/ }: skipped, ${c}s left before attention_report.py's ${report_min}s"
            continue
        fi
        # the 5th launch of the kernel: the causal block's timed run (after
        # bench/blocks' set-up pass, the full block's warm-up and timed run,
        # and the causal block's warm-up)
        f=$(flags_of "$v")
        # shellcheck disable=SC2086 # the flag and its value, two words (none by default)
        timeout -k 5 "$c" "$ncu" --clock-control none --section SourceCounters --import-source yes \
            -k regex:fwd_wgmma --launch-skip 4 -c 1 -f -o "$prof/rep_$n" "$build/prof/blocks" \
            --backend cuda --kernel wgmma --section r --pass fwd --heads 32 --kv-heads 32 --dim 128 \
            --dtype bf16 --c 4096 --iters 1 $f >"$prof/ncu_$n.log" 2>&1 &&
            timeout -k 5 60 "$ncu" -i "$prof/rep_$n.ncu-rep" --page source --csv \
                --print-source cuda,sass >"$prof/source_$n.csv" 2>>"$prof/ncu_$n.log"
        rcs[ncu]=$?
        log "ncu source counters, ${v/_/ }: $(exited ncu)"
        if [ -s "$prof/source_$n.csv" ]; then
            python3 bench/ncu_source.py "$prof/source_$n.csv" --top 12 --split "$cuts" 2>&1 |
                tee -a "$summary"
            gzip -f "$prof/source_$n.csv"
        fi
        tar czf "$out/ncu_source.tgz" -C "$prof" .   # what there is, should a later step be cut
    done
    rm -rf "$prof"
fi

left=$((budget - SECONDS - 15))
if [ "$left" -lt 30 ]; then
    log "attention_report.py: skipped, ${left}s of the budget left"
    ok=0
else
    flags=()
    [ "$mma_only" = 1 ] && flags+=(--kernels mma)
    # a hung step costs at most a third of what is left (90 to 150 s)
    step=$((left / 3))
    [ "$step" -lt 90 ] && step=90
    [ "$step" -gt 150 ] && step=150
    python3 bench/attention_report.py --build "$build" --budget "$left" --step-timeout "$step" "${flags[@]}" \
        --json-out "$out/attention_report.json" >"$out/attention_report.md" 2>"$out/attention_report.err"
    rc=$?
    log "attention_report.py --budget $left --step-timeout $step ${flags[*]}: exit $rc"
    sed -n '/^## summary/,$p' "$out/attention_report.md" | tee -a "$summary"
    [ "$rc" = 0 ] || ok=0
fi
[ "$ok" = 1 ]
