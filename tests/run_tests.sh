#!/usr/bin/env bash
# tests/run_tests.sh DIR — run every executable DIR/test_* and total the results.
#
# DIR/test_mpi runs under mpirun for 1..4 processes (see run_mpi_suite; MPIRUN
# names the mpirun to use, the Makefile passes the one it found).
# Each binary runs under `timeout` (DT_TEST_TIMEOUT seconds, default 300); a
# binary that hangs is killed and counted as one failure. DT_TIMEOUT_MS, if
# set, reaches the tests unchanged (they use it for their own waits). Output
# is streamed as it comes. Each binary ends with a line
#     --- NAME: N passed, N failed, N skipped in S s
# and the whole run with "failed:" and each failed test, with the last lines
# it printed, if any failed, then "(the suites took S s)"; the last line is always
#     N passed, N failed, N skipped
# and the exit status is non-zero if anything failed.
#
# Counting follows cmocka 1.1's standard output (checked against 1.1.5):
#   stdout: [ RUN      ] name / [       OK ] name / [  FAILED  ] name /
#           [  SKIPPED ] name, one result line per test;
#   stderr, per group: [  PASSED  ] N test(s).
#                      [  FAILED  ] N test(s), listed below:   + one line per name
#                      [  SKIPPED ] N test(s), listed below:   + one line per name
# Failed and skipped names are therefore printed twice; the per-test counts
# are the name lines minus the N of the "listed below" headers, which holds
# even when stdout and stderr interleave out of order or a binary dies before
# its summary. A binary that exits non-zero (crash, abort, group setup
# failure) without any failed test line counts as one failure.

set -uo pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
    echo "usage: $0 DIR   (runs DIR/test_*; DIR must exist)" >&2
    exit 2
fi
dir=${1%/}
limit=${DT_TEST_TIMEOUT:-300}
[ -n "${DT_TIMEOUT_MS:-}" ] && export DT_TIMEOUT_MS

# The counting below needs cmocka's standard format, whatever the caller set.
export CMOCKA_MESSAGE_OUTPUT=STDOUT

# Line-buffer the tests' stdout so output streams and keeps its order with
# stderr. stdbuf works by LD_PRELOAD, which AddressSanitizer refuses unless
# told not to check its link order.
buf=()
if command -v stdbuf >/dev/null 2>&1; then
    buf=(stdbuf -oL -eL)
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
fi

# Sanitizer builds: an allocation too large to make returns NULL, as it does
# without them (they abort by default): the tests ask for some on purpose,
# to see the library return DT_ERR_OUT_OF_MEMORY.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1"
export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS:}allocator_may_return_null=1"

log=$(mktemp "${TMPDIR:-/tmp}/dt_run_tests.XXXXXX") || exit 2
trap 'rm -f "$log"' EXIT

count() { # count REGEX: number of matching lines in $log
    grep -cE "$1" "$log" || true
}
sum() { # sum REGEX: sum of the first number on matching lines in $log
    grep -E "$1" "$log" | sed -E 's/^[^0-9]*([0-9]+).*/\1/' |
        awk '{ s += $1 } END { print s + 0 }'
}

# why_failed NAME: the last lines test NAME printed in $log before its
# FAILED line (at most 8, each on its own indented line; nothing if its RUN
# line is missing).
why_failed() {
    awk -v run="[ RUN      ] $1" -v end="[  FAILED  ] $1" '
        $0 == run { n = 0; on = 1; next }
        $0 == end && on { for (i = (n > 8 ? n - 8 : 0); i < n; i++) printf "\n      | %s", b[i]; exit }
        on { b[n++] = $0 }' "$log"
}

# last_lines: the last 8 lines of $log, each on its own indented line: what a
# binary that died or hung printed last (a dependency's message among them),
# kept for the list at the end, which is what survives a truncated log.
last_lines() {
    tail -n 8 "$log" | awk '{ printf "\n      | %s", $0 }'
}

total_pass=0 total_fail=0 total_skip=0 nbin=0
failures=()

# run_one NAME CMD...: run one test program, count its results into the totals.
run_one() {
    local name=$1
    shift
    nbin=$((nbin + 1))
    echo "=== $name"

    # The group's 2>/dev/null only hides bash's own "Aborted ..." job report;
    # the test's stderr is already merged into the pipe.
    # DT_TEST_WRAPPER (e.g. valgrind ...) runs each test under a tool; not
    # the MPI suite, whose command is mpirun itself (no_wrap).
    local wrap=()
    if [ -n "${DT_TEST_WRAPPER:-}" ] && [ -z "${no_wrap:-}" ]; then read -ra wrap <<<"$DT_TEST_WRAPPER"; fi
    local t0=$SECONDS
    { timeout -k 10 "$limit" "${buf[@]}" "${wrap[@]}" "$@" 2>&1 | tee "$log"; } 2>/dev/null
    local rc=${PIPESTATUS[0]}
    local secs=$((SECONDS - t0))

    local hdr_fail='^\[  FAILED  \] [0-9]+ test\(s\), listed below:'
    local hdr_skip='^\[  SKIPPED \] [0-9]+ test\(s\), listed below:'
    # "[  FAILED  ] GROUP SETUP" comes with an "[  ERROR   ] group" line.
    local grp='^\[  FAILED  \] GROUP (SETUP|TEARDOWN)$'
    local pass fail skip
    pass=$(count '^\[       OK \] ')
    fail=$(( $(count '^\[  FAILED  \] ') - $(count "$grp") - $(count "$hdr_fail") - $(sum "$hdr_fail") ))
    skip=$(( $(count '^\[  SKIPPED \] ') - $(count "$hdr_skip") - $(sum "$hdr_skip") ))
    # A test whose fixture failed is reported as "[  ERROR   ] name" (the
    # "[  ERROR   ] --- msg" lines are messages, not results).
    fail=$((fail + $(count '^\[  ERROR   \] [^-]')))
    ((fail < 0)) && fail=0
    ((skip < 0)) && skip=0

    # Names of the failed tests, once each, for the list at the end, each
    # with the last lines it printed (its assertion's message among them):
    # where only the end of a run's output is kept, the reason is still there.
    while IFS= read -r t; do
        failures+=("$name: $t$(why_failed "$t")")
    done < <(grep -E '^\[  (FAILED  |ERROR   )\] ' "$log" |
        grep -vE "$hdr_fail|$grp" | grep -vE '^\[  ERROR   \] ---' |
        sed -E 's/^\[[^]]*\] //' | awk '!seen[$0]++')

    # The test that was running when the binary died or hung, if any: the
    # last per-test line is a RUN line.
    local last during=
    last=$(grep -E '^\[ RUN      \] |^\[ {2}( {5}OK |FAILED  |SKIPPED |ERROR   )\] [^-0-9]' "$log" | tail -n1)
    case $last in "[ RUN      ] "*) during=" during ${last#\[ RUN      \] }" ;; esac

    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "*** $name: HUNG$during — killed after ${limit}s (DT_TEST_TIMEOUT); counted as a failure"
        fail=$((fail + 1))
        failures+=("$name: hung$during, killed after ${limit}s$(last_lines)")
    elif [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then
        local why
        if [ "$rc" -gt 128 ]; then
            why="killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
        else
            why="exit status $rc"
        fi
        echo "*** $name: $why$during without a failed test line; counted as a failure"
        fail=1
        failures+=("$name: $why$during$(last_lines)")
    fi

    echo "--- $name: $pass passed, $fail failed, $skip skipped in $secs s"
    total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail))
    total_skip=$((total_skip + skip))
}

# The MPI suite runs under mpirun, once per process count
# (DT_TEST_MPI_NP, default "1 2 3 4"). Only its rank 0 prints cmocka output
# (the others' stdout goes to /dev/null; every rank asserts on all ranks'
# results, and a rank that still fails makes mpirun exit non-zero, which is
# counted). When the binary has no MPI, or mpirun is missing or cannot start
# processes here, it runs once on its own and reports itself skipped with
# the reason. Open MPI gets what a container needs: --oversubscribe (more
# ranks than cores), shared memory only (no network), --allow-run-as-root
# when root.
run_mpi_suite() {
    local bin=$1 name=${1##*/}
    if ! "$bin" --built-with-mpi >/dev/null 2>&1; then
        run_one "$name" "$bin"
        return
    fi
    local mpirun=${MPIRUN:-$(command -v mpirun 2>/dev/null)}
    if [ -z "$mpirun" ] || [ ! -x "$mpirun" ]; then
        DT_TEST_MPI_SKIP="no mpirun in PATH (apt-get install openmpi-bin, or make MPI_HOME=<prefix>)" \
            run_one "$name" "$bin"
        return
    fi
    local args=()
    local ver
    ver=$("$mpirun" --version 2>&1 | head -n1)
    if [[ $ver == *"Open MPI"* ]]; then
        local major
        major=$(sed -E 's/.*[^0-9]([0-9]+)\.[0-9]+.*/\1/' <<<"$ver")
        args=(--oversubscribe --bind-to none)
        if [ "${major:-4}" -ge 5 ] 2>/dev/null; then
            args+=(--mca btl self,sm)
        else
            args+=(--mca btl self,vader --mca btl_vader_single_copy_mechanism none)
        fi
        [ "$(id -u)" = 0 ] && args+=(--allow-run-as-root)
    fi
    local out
    if ! out=$(timeout -k 5 60 "$mpirun" "${args[@]}" -np 1 true 2>&1); then
        out=$(printf '%s\n' "$out" | grep -v '^[-[:space:]]*$' | head -n 3 | tr '\n' ' ')
        DT_TEST_MPI_SKIP="mpirun cannot start processes here: ${out:-no output}" \
            run_one "$name" "$bin"
        return
    fi
    # Sanitizer builds: no leak report for these processes. Open MPI keeps
    # allocations until exit in components it has unloaded by then, which
    # LeakSanitizer can neither attribute nor suppress (and may crash
    # reporting); address and UB checks stay on. The thread suites check
    # the library's own leaks.
    local np
    for np in ${DT_TEST_MPI_NP:-1 2 3 4}; do
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" no_wrap=1 \
            run_one "$name -np $np" "$mpirun" "${args[@]}" -np "$np" "$bin"
    done
}

shopt -s nullglob
for bin in "$dir"/test_*; do
    if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then continue; fi
    case ${bin##*/} in
    test_mpi) run_mpi_suite "$bin" ;;
    *) run_one "${bin##*/}" "$bin" ;;
    esac
done

if [ "$nbin" -eq 0 ]; then
    echo "warning: no test binaries ($dir/test_*)"
fi
if [ "${#failures[@]}" -gt 0 ]; then
    echo "failed:"
    printf '  %s\n' "${failures[@]}"
fi
echo "(the suites took $SECONDS s)"
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
