#!/usr/bin/env bash
# tests/run_tests.sh DIR — run every executable DIR/test_* and total the results.
#
# Each binary runs under `timeout` (DT_TEST_TIMEOUT seconds, default 300); a
# binary that hangs is killed and counted as one failure. DT_TIMEOUT_MS, if
# set, reaches the tests unchanged (they use it for their own waits). Output
# is streamed as it comes. The last line is always
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

log=$(mktemp "${TMPDIR:-/tmp}/dt_run_tests.XXXXXX") || exit 2
trap 'rm -f "$log"' EXIT

count() { # count REGEX: number of matching lines in $log
    grep -cE "$1" "$log" || true
}
sum() { # sum REGEX: sum of the first number on matching lines in $log
    grep -E "$1" "$log" | sed -E 's/^[^0-9]*([0-9]+).*/\1/' |
        awk '{ s += $1 } END { print s + 0 }'
}

total_pass=0 total_fail=0 total_skip=0 nbin=0
failures=()

shopt -s nullglob
for bin in "$dir"/test_*; do
    if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then continue; fi
    name=${bin##*/}
    nbin=$((nbin + 1))
    echo "=== $name"

    # The group's 2>/dev/null only hides bash's own "Aborted ..." job report;
    # the test's stderr is already merged into the pipe.
    { timeout -k 10 "$limit" "${buf[@]}" "$bin" 2>&1 | tee "$log"; } 2>/dev/null
    rc=${PIPESTATUS[0]}

    hdr_fail='^\[  FAILED  \] [0-9]+ test\(s\), listed below:'
    hdr_skip='^\[  SKIPPED \] [0-9]+ test\(s\), listed below:'
    # "[  FAILED  ] GROUP SETUP" comes with an "[  ERROR   ] group" line.
    grp='^\[  FAILED  \] GROUP (SETUP|TEARDOWN)$'
    pass=$(count '^\[       OK \] ')
    fail=$(( $(count '^\[  FAILED  \] ') - $(count "$grp") - $(count "$hdr_fail") - $(sum "$hdr_fail") ))
    skip=$(( $(count '^\[  SKIPPED \] ') - $(count "$hdr_skip") - $(sum "$hdr_skip") ))
    # A test whose fixture failed is reported as "[  ERROR   ] name" (the
    # "[  ERROR   ] --- msg" lines are messages, not results).
    fail=$((fail + $(count '^\[  ERROR   \] [^-]')))
    ((fail < 0)) && fail=0
    ((skip < 0)) && skip=0

    # Names of the failed tests, once each, for the list at the end.
    while IFS= read -r t; do
        failures+=("$name: $t")
    done < <(grep -E '^\[  (FAILED  |ERROR   )\] ' "$log" |
        grep -vE "$hdr_fail|$grp" | grep -vE '^\[  ERROR   \] ---' |
        sed -E 's/^\[[^]]*\] //' | awk '!seen[$0]++')

    # The test that was running when the binary died or hung, if any: the
    # last per-test line is a RUN line.
    last=$(grep -E '^\[ RUN      \] |^\[ {2}( {5}OK |FAILED  |SKIPPED |ERROR   )\] [^-0-9]' "$log" | tail -n1)
    during=
    case $last in "[ RUN      ] "*) during=" during ${last#\[ RUN      \] }" ;; esac

    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "*** $name: HUNG$during — killed after ${limit}s (DT_TEST_TIMEOUT); counted as a failure"
        fail=$((fail + 1))
        failures+=("$name: hung$during, killed after ${limit}s")
    elif [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then
        if [ "$rc" -gt 128 ]; then
            why="killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
        else
            why="exit status $rc"
        fi
        echo "*** $name: $why$during without a failed test line; counted as a failure"
        fail=1
        failures+=("$name: $why$during")
    fi

    echo "--- $name: $pass passed, $fail failed, $skip skipped"
    total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail))
    total_skip=$((total_skip + skip))
done

if [ "$nbin" -eq 0 ]; then
    echo "warning: no test binaries ($dir/test_*)"
fi
if [ "${#failures[@]}" -gt 0 ]; then
    echo "failed:"
    printf '  %s\n' "${failures[@]}"
fi
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
