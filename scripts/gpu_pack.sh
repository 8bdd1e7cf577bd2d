#!/usr/bin/env bash
# scripts/gpu_pack.sh — build here and pack what a device call on a lent GPU
# machine needs to run the tests and benches without building there:
#
#   scripts/gpu_pack.sh [--profile] [--bisect "REV ..."] [DIR]   (DIR default .gpu/build)
#
# --bisect also builds bench/blocks at each git revision REV (a detached
# worktree under /tmp, `make bench` there, removed after) into
# DIR/bisect/SHA/blocks, SHA its short hash (about 2.7 MiB each), for
# scripts/gpu_session.sh to time the wgmma forward of each beside this
# build's: which commit changed its speed (the H200 of 2026-11-29
# measured it 22% slower at D = 128 than on 2026-11-27). REV:VAR=VAL
# builds REV with that make variable (several: REV:A=1:B=2), into
# DIR/bisect/SHA_VAR_VAL; the variable must be in REV's Makefile. So
# "HEAD:WGMMA_NARROW=0" is this tree's kernel without its narrow tiles.
#
# --profile also builds bench/blocks with the device code's source lines
# (make LINEINFO=1, in build-lineinfo/) into DIR/prof/blocks, for
# scripts/gpu_session.sh --profile (Nsight Compute's source page; the whole
# build with line tables would not fit a device call), and records in
# DIR/ROOT where the sources were, which ncu reads them from.
# It runs `make all bench` (tests included where cmocka is found), copies
# every program of build/bench, build/tests and build/examples into DIR's
# bench/, tests/ and examples/ without their debug symbols (strip; about
# 41 MiB in all on 2026-11-27, 51 with --profile before the bulk end went,
# under the device tool's 64 MiB; it says so if it is more), and unpacks
# cmocka into
# .deps/root/usr if it is not there (the GPU machines have none), then adds
# /.gpu/ and /.deps/ to .git/info/exclude so that neither travels as
# untracked files. The device call then carries [".deps", ".gpu"] and runs
#
#   scripts/gpu_session.sh --prebuilt .gpu/build 480   (tests, attention_report.py)
#   scripts/gpu_check.sh --prebuilt .gpu/build 540     (the thorough check)
#
# A build made on this project's Debian 12 machine (nvcc 13.0, sm_90) ran
# unchanged on the lent Ubuntu 24.04 H200 (2026-11-26): the programs link
# the CUDA runtime, cuBLAS, NCCL, OpenBLAS and Open MPI by their sonames,
# which that machine has. Where one does not load there, gpu_check.sh's
# first step fails naming it: build there instead (without --prebuilt).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=0
revs=""
while [ $# -gt 0 ]; do
    case $1 in
    --profile) profile=1 ;;
    --bisect)
        [ $# -ge 2 ] || { echo "gpu_pack: --bisect needs revisions" >&2; exit 2; }
        revs=$2
        shift
        ;;
    *) break ;;
    esac
    shift
done
dest=${1:-.gpu/build}
case $dest in -h | --help) sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

make -j"$(nproc)" all bench
[ -d build/tests ] && ls build/tests/test_* >/dev/null 2>&1 ||
    { echo "gpu_pack: no tests were built (is cmocka installed here?)" >&2; exit 1; }

rm -rf "$dest"
for d in bench tests examples; do
    mkdir -p "$dest/$d"
    for f in build/"$d"/*; do
        [ -f "$f" ] && [ -x "$f" ] && strip -o "$dest/$d/$(basename "$f")" "$f"
    done
done
if [ "$profile" = 1 ]; then
    make -j"$(nproc)" LINEINFO=1 bench
    mkdir -p "$dest/prof"
    strip -o "$dest/prof/blocks" build-lineinfo/bench/blocks
    pwd >"$dest/ROOT"
fi
for spec in $revs; do
    rev=${spec%%:*}
    vars=()
    [ "$rev" = "$spec" ] || IFS=: read -r -a vars <<<"${spec#*:}"
    sha=$(git rev-parse --short "$rev^{commit}") || { echo "gpu_pack: no revision '$rev'" >&2; exit 2; }
    name=$sha
    for v in ${vars[@]+"${vars[@]}"}; do name=${name}_$(printf '%s' "$v" | tr -c 'A-Za-z0-9' _); done
    wt=/tmp/gpu_pack_bisect_$name
    [ -d "$wt" ] || git worktree add --detach "$wt" "$sha" >/dev/null
    for v in ${vars[@]+"${vars[@]}"}; do
        grep -q "^${v%%=*}\b" "$wt/Makefile" ||
            { echo "gpu_pack: $sha's Makefile has no ${v%%=*}" >&2; git worktree remove --force "$wt"; exit 2; }
    done
    make -C "$wt" -j"$(nproc)" ${vars[@]+"${vars[@]}"} bench >"$wt.log" 2>&1 ||
        { echo "gpu_pack: bench at $spec did not build ($wt.log)" >&2; exit 1; }
    mkdir -p "$dest/bisect/$name"
    strip -o "$dest/bisect/$name/blocks" "$wt/build/bench/blocks"
    git worktree remove --force "$wt"
done
git rev-parse --short HEAD >"$dest/COMMIT" 2>/dev/null || true
git diff --quiet HEAD 2>/dev/null || echo "with uncommitted changes" >>"$dest/COMMIT"

if ! find .deps/root/usr -name 'libcmocka.so*' 2>/dev/null | grep -q .; then
    mkdir -p .deps
    (cd .deps && apt-get download libcmocka0 libcmocka-dev >/dev/null &&
        for f in *.deb; do dpkg -x "$f" root; done)
fi

exclude=.git/info/exclude
if [ -d .git ]; then
    mkdir -p .git/info
    for p in /.gpu/ /.deps/; do
        grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >>"$exclude"
    done
fi

echo "gpu_pack: $(du -sh "$dest" | cut -f1) in $dest (commit $(head -n 1 "$dest/COMMIT" 2>/dev/null || echo '?'))"
mib=$(du -smc "$dest" .deps 2>/dev/null | tail -n 1 | cut -f1)
[ "${mib:-0}" -gt 58 ] && echo "gpu_pack: $dest and .deps are $mib MiB, and a device call carries" \
    "64 MiB with the checkout (about 3): too much" >&2
flag=""
[ "$profile" = 1 ] && flag="--profile "
echo "device call: carry [\".deps\", \".gpu\"], command: scripts/gpu_session.sh $flag--prebuilt $dest 480"
echo "  (timeout_s 500; or the thorough scripts/gpu_check.sh --prebuilt $dest 540, a call of its own)"
