#!/bin/sh
# scripts/deps.sh — make sure the build dependencies of dtensor are present.
#
#   scripts/deps.sh                 probe cmocka, OpenBLAS, CMake and Open MPI; install what is missing
#   scripts/deps.sh --without-mpi   leave MPI out (make MPI=0 passes this)
#   scripts/deps.sh --check         probe only, never install (exit 1 if missing)
#   (--with-mpi is accepted for older callers: MPI is in by default)
#
# Detection is by try-compile, the same way the Makefile does it, honouring
# CC, CMOCKA_ROOT and OPENBLAS_ROOT (a prefix such as /opt/x/usr holding
# include/ and lib/ or lib/<multiarch>/, e.g. unpacked .debs) and MPI_HOME
# (an MPI installation with bin/mpicc and bin/mpirun; when given, it is
# probed and never installed over). Open MPI's packages are openmpi-bin
# (mpirun) and libopenmpi-dev (mpicc, mpi.h). CMake (package cmake; found
# when `cmake --version` runs) serves one test: tests/test_docs.c builds
# README.md's program with find_package(dtensor), and skips without it.
# Silent and fast when everything is present. Otherwise, as root (or with
# passwordless sudo) it runs `apt-get update` once and `apt-get install` for
# the missing packages only; without either it prints what to install and
# exits 1.
# All messages go to stderr: the Makefile calls this inside $(shell ...).
#
# Exit status: 0 all present (after installing if needed), 1 something is
# still missing, 2 bad usage.

set -u

CC=${CC:-cc}
CMOCKA_ROOT=${CMOCKA_ROOT:-}
OPENBLAS_ROOT=${OPENBLAS_ROOT:-}
MPI_HOME=${MPI_HOME:-}
with_mpi=1
check_only=0

for arg in "$@"; do
    case $arg in
    --with-mpi) with_mpi=1 ;;
    --without-mpi) with_mpi=0 ;;
    --check) check_only=1 ;;
    -h | --help)
        sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2
        exit 0
        ;;
    *)
        echo "deps.sh: unknown argument '$arg' (try --help)" >&2
        exit 2
        ;;
    esac
done

say() { echo "deps.sh: $*" >&2; }

multiarch=$($CC -print-multiarch 2>/dev/null)
[ -n "$multiarch" ] || multiarch=x86_64-linux-gnu

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dtdeps.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# root_flags ROOT [SUBDIR...]: -I/-L/-rpath flags for a prefix. Kept in step
# with the Makefile's candidate directories.
root_flags() {
    r=$1
    shift
    f="-I$r/include -I$r/include/$multiarch"
    for s in "$@"; do f="$f -I$r/include/$s -I$r/include/$multiarch/$s"; done
    for d in "$r/lib" "$r/lib/$multiarch"; do
        f="$f -L$d -Wl,-rpath,$d"
        for s in "$@"; do f="$f -L$d/$s -Wl,-rpath,$d/$s"; done
    done
    echo "$f"
}

# try NAME FLAGS LIBS: compile and link $tmp/NAME.c. FLAGS and LIBS are
# word-split on purpose (they are lists of options).
try() {
    # shellcheck disable=SC2086
    $CC -std=c11 -D_POSIX_C_SOURCE=200809L $2 "$tmp/$1.c" -o "$tmp/$1" $3 \
        >"$tmp/$1.log" 2>&1
}

cat >"$tmp/cmocka.c" <<'EOF'
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
static void t(void **state) { (void)state; assert_true(1); }
int main(void) {
    const struct CMUnitTest tests[] = { cmocka_unit_test(t) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
EOF

cat >"$tmp/openblas.c" <<'EOF'
#include <cblas.h>
int main(void) {
    float a = 1, b = 2, c = 0;
    openblas_set_num_threads(1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1,
                1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
    return c == 2.0f ? 0 : 1;
}
EOF

cat >"$tmp/mpi.c" <<'EOF'
#include <mpi.h>
int main(int argc, char **argv) { MPI_Init(&argc, &argv); return MPI_Finalize(); }
EOF

have_cmocka() {
    flags=
    [ -n "$CMOCKA_ROOT" ] && flags=$(root_flags "$CMOCKA_ROOT")
    try cmocka "$flags" -lcmocka
}

have_openblas() {
    # Debian puts cblas.h under /usr/include/<multiarch>/ (an alternatives
    # link) and the real files under .../openblas-pthread/; Fedora uses
    # /usr/include/openblas. Try the plain search path first.
    if [ -n "$OPENBLAS_ROOT" ]; then
        try openblas "$(root_flags "$OPENBLAS_ROOT" openblas-pthread openblas)" -lopenblas && return 0
    fi
    try openblas "" -lopenblas && return 0
    for s in "$multiarch/openblas-pthread" openblas; do
        try openblas "-I/usr/include/$s -L/usr/lib/$s" -lopenblas && return 0
    done
    return 1
}

# mpicc that builds a program, and mpirun beside it (the tests need both).
have_mpi() {
    if [ -n "$MPI_HOME" ]; then
        mpicc=$MPI_HOME/bin/mpicc mpirun=$MPI_HOME/bin/mpirun
    else
        mpicc=$(command -v mpicc 2>/dev/null) mpirun=$(command -v mpirun 2>/dev/null)
    fi
    [ -n "$mpicc" ] && [ -x "$mpicc" ] && [ -n "$mpirun" ] && [ -x "$mpirun" ] &&
        "$mpicc" "$tmp/mpi.c" -o "$tmp/mpi" >"$tmp/mpi.log" 2>&1
}

# cmake in PATH that runs.
have_cmake() {
    command -v cmake >/dev/null 2>&1 && cmake --version >"$tmp/cmake.log" 2>&1
}

probe() {
    missing=
    have_cmocka || missing="$missing libcmocka-dev"
    have_openblas || missing="$missing libopenblas-dev"
    have_cmake || missing="$missing cmake"
    mpi_missing=0
    if [ "$with_mpi" = 1 ] && ! have_mpi; then
        mpi_missing=1
        # A given MPI_HOME is the user's: say so rather than install another.
        [ -z "$MPI_HOME" ] && missing="$missing openmpi-bin libopenmpi-dev"
    fi
    missing=${missing# }
}

probe
if [ "$mpi_missing" = 1 ] && [ -n "$MPI_HOME" ]; then
    say "MPI_HOME=$MPI_HOME has no working bin/mpicc and bin/mpirun; the MPI transport will not be built"
fi
[ -z "$missing" ] && exit 0

how_else() {
    say "or, without a package manager, unpack the .debs into a prefix and point the"
    say "build at it, e.g.:"
    say "  apt-get download libcmocka0 libcmocka-dev && for f in *.deb; do dpkg -x \$f root; done"
    say "  make CMOCKA_ROOT=\$PWD/root/usr   (OPENBLAS_ROOT=... likewise for OpenBLAS)"
}

if [ "$check_only" = 1 ]; then
    say "missing: $missing (install: sudo apt-get install $missing)"
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    say "missing: $missing"
    say "no apt-get on this machine: install the equivalent packages with your"
    say "package manager (development files of: $missing)"
    how_else
    exit 1
fi

if [ "$(id -u)" = 0 ]; then
    sudo=
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
else
    say "missing: $missing"
    say "install them with:"
    say "  sudo apt-get install $missing"
    how_else
    exit 1
fi

say "missing: $missing — installing with apt-get"
# Wait for the dpkg lock rather than fail when another make is installing too.
apt="$sudo env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300"
# shellcheck disable=SC2086
if ! $apt update >&2; then
    say "apt-get update failed (no network or no package mirror?)."
    say "install by hand: sudo apt-get install $missing"
    how_else
    exit 1
fi
# shellcheck disable=SC2086
if ! $apt install -y --no-install-recommends $missing >&2; then
    say "apt-get install $missing failed (no network? see the messages above)."
    how_else
    exit 1
fi

probe
if [ -n "$missing" ]; then
    say "installed, but the try-compile probe still fails for: $missing"
    for f in "$tmp"/*.log; do
        [ -s "$f" ] && sed 's/^/  /' "$f" >&2
    done
    exit 1
fi
say "dependencies installed."
exit 0
