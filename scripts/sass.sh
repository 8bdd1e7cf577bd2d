#!/bin/sh
# scripts/sass.sh: the SASS (machine code) of the CUDA kernels, on a machine
# without a GPU.
#
#   scripts/sass.sh [--kernel PAT] [--summary | --loops] FILE.cu [NVCC_FLAG...]
#   scripts/sass.sh [--kernel PAT] [--summary | --loops] FILE.cubin
#
# A .cu is compiled to a cubin as the Makefile compiles it (nvcc -O2, sm_90a
# for the files that use wgmma, else NVCC_ARCH, default sm_90), with any
# extra flags after it (e.g. -DDT_WGMMA_NARROW=0), run from the repository
# root. --kernel prints only the functions whose name, mangled or not,
# contains PAT (e.g. 'fwd_wgmma_kernel<__nv_bfloat16, 128, 1>': the bf16
# D = 128 wgmma forward with its producer, the default; the names shown
# are c++filt's where binutils is installed); --summary prints, instead
# of the code, a line per function: its instructions, tensor-core
# instructions (HGMMA, HMMA), local memory accesses (LDL, STL: spills) and
# named barriers (BAR); --loops, a line per loop (a backward branch and
# what it jumps back over) that holds tensor-core or SFU instructions: its
# instructions, tensor-core instructions, MUFU (the exponentials) and
# shared-memory accesses (a kernel's key-tile loop is the one with its
# products and exponentials, the softmax's two copies inside it).
#
# The disassembler: $CUDA_HOME/bin/nvdisasm where the toolkit has one. The
# CUDA 13 toolkit installed here has none, so the script otherwise uses the
# nvdisasm of CUDA 11.8 from Debian 12's non-free package
# nvidia-cuda-toolkit (downloaded once, 84 MB, checked against its SHA256,
# only nvdisasm kept, in ${XDG_CACHE_HOME:-$HOME/.cache}/dtensor). That one
# predates the ELF header of CUDA 12.8's cubins, so it reads a copy whose
# header says what its own toolkit wrote for sm_90 (the instructions are
# untouched); it decodes Hopper's instructions, HGMMA included, and gave
# the same text as its own ptxas's cubin for a test kernel (2026-12-01).
# A tool for reading code, never a build step.
#
# Exit status: 0 done, 1 a tool or download failed, 2 bad usage.

set -eu

CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC_ARCH=${NVCC_ARCH:-sm_90}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/dtensor
DEB=nvidia-cuda-toolkit_11.8.89~11.8.0-5~deb12u1_amd64.deb
DEB_URL=http://deb.debian.org/debian/pool/non-free/n/nvidia-cuda-toolkit/$DEB
DEB_SHA256=d1156026e704fe0368b6295db06224ed00a727966fb13454f34e3f3102db0457

usage() {
    sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

kernel=
mode=code
while [ $# -gt 0 ]; do
    case $1 in
    --kernel) [ $# -ge 2 ] || usage; kernel=$2; shift 2 ;;
    --summary) mode=summary; shift ;;
    --loops) mode=loops; shift ;;
    -h | --help) usage ;;
    -*) echo "sass.sh: unknown option $1" >&2; usage ;;
    *) break ;;
    esac
done
[ $# -ge 1 ] || usage
src=$1
shift
[ -f "$src" ] || { echo "sass.sh: no file $src" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

case $src in
*.cu)
    if grep -q 'ptx_sm90\.cuh\|DT_WGMMA_SM90A' "$src"; then   # the Makefile's sm_90a files
        arch="-gencode=arch=compute_90a,code=sm_90a -DDT_WGMMA_SM90A"
    else
        arch="-arch=$NVCC_ARCH"
    fi
    # shellcheck disable=SC2086 # arch is two words on purpose
    "$CUDA_HOME/bin/nvcc" $arch -std=c++17 -O2 -I. -DDT_HAVE_CUDA -DDT_HAVE_NCCL "$@" \
        -cubin -o "$tmp/k.cubin" "$src" || exit 1
    ;;
*.cubin)
    [ $# -eq 0 ] || { echo "sass.sh: flags are for a .cu only" >&2; exit 2; }
    cp "$src" "$tmp/k.cubin"
    ;;
*) echo "sass.sh: $src is neither a .cu nor a .cubin" >&2; exit 2 ;;
esac

if [ -x "$CUDA_HOME/bin/nvdisasm" ]; then
    dis=$CUDA_HOME/bin/nvdisasm
    old=0
else
    dis=$CACHE/nvdisasm-11.8
    old=1
    if [ ! -x "$dis" ]; then
        echo "sass.sh: no nvdisasm in $CUDA_HOME/bin; fetching CUDA 11.8's from Debian ($DEB_URL)" >&2
        mkdir -p "$CACHE"
        curl -fsS -o "$tmp/$DEB" "$DEB_URL" || { echo "sass.sh: download failed" >&2; exit 1; }
        echo "$DEB_SHA256  $tmp/$DEB" | sha256sum -c --quiet - >&2 ||
            { echo "sass.sh: $DEB does not match its SHA256" >&2; exit 1; }
        if ! dpkg-deb -x "$tmp/$DEB" "$tmp/deb" || ! mv "$tmp/deb/usr/bin/nvdisasm" "$dis"; then
            echo "sass.sh: could not unpack nvdisasm" >&2
            exit 1
        fi
    fi
fi

if [ $old = 1 ]; then   # the header as CUDA 11.8 wrote it for sm_90
    python3 - "$tmp/k.cubin" <<'EOF' || exit 1
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
if b[:4] != b'\x7fELF' or struct.unpack_from('<H', b, 18)[0] != 190:
    sys.exit('sass.sh: not a CUDA cubin')
b[7], b[8] = 51, 7                          # EI_OSABI, EI_ABIVERSION
struct.pack_into('<I', b, 20, 118)          # e_version
struct.pack_into('<I', b, 0x30, 0x5a055a)   # e_flags: sm_90, virtual sm_90, 64-bit
open(sys.argv[1], 'wb').write(b)
EOF
fi

"$dis" -c "$tmp/k.cubin" >"$tmp/k.sass" || exit 1

python3 - "$tmp/k.sass" "$kernel" "$mode" <<'EOF'
import re, shutil, signal, subprocess, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # quiet under head
path, pat, mode = sys.argv[1], sys.argv[2], sys.argv[3]
funcs, name = [], None
for line in open(path):
    m = re.match(r'^(\S+):$', line)
    if m and not m.group(1).startswith('.'):
        name = m.group(1)
        funcs.append((name, []))
    elif line.startswith('//----'):
        name = None
    if name and funcs:
        funcs[-1][1].append(line.rstrip('\n'))
# readable names (c++filt, where binutils has it); a callee's ($kernel$callee) its own
names = [f[0].split('$')[-1] for f in funcs]
if shutil.which('c++filt') and names:
    names = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True,
                           text=True).stdout.split('\n')[:len(names)]
names = [n.replace('(anonymous namespace)::', '') for n in names]
funcs = [(n, f[1]) for n, f in zip(names, funcs) if pat in f[0] or pat in n]
if not funcs:
    sys.exit('sass.sh: no function matches %r' % pat)
op = re.compile(r'\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)(.*)')
if mode == 'summary':
    print('%8s %6s %6s %5s  %s' % ('instrs', 'tensor', 'local', 'bar', 'function'))
for fname, lines in funcs:
    if mode == 'code':
        print('// ' + fname)
        print('\n'.join(lines))
        continue
    ins, labels, pending = [], {}, []   # (address, opcode, operands); label: address
    for line in lines:
        m = re.match(r'^(\.L_x_\d+):', line)
        if m:
            pending.append(m.group(1))
            continue
        m = op.match(line)
        if m:
            for lab in pending:
                labels[lab] = int(m.group(1), 16)
            pending = []
            ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
    count = lambda ops, *names: sum(o[1] in names for o in ops)
    if mode == 'summary':
        print('%8d %6d %6d %5d  %s' % (len(ins), count(ins, 'HGMMA', 'HMMA'),
                                        count(ins, 'LDL', 'STL'), count(ins, 'BAR'), fname))
        continue
    print('// ' + fname)
    print('%15s %8s %6s %5s %5s' % ('loop', 'instrs', 'tensor', 'MUFU', 'smem'))
    for addr, opc, rest in ins:
        m = re.search(r'`\((\.L_x_\d+)\)', rest)
        if opc != 'BRA' or not m or labels.get(m.group(1), addr + 1) > addr:
            continue
        body = [o for o in ins if labels[m.group(1)] <= o[0] <= addr]
        tensor, mufu = count(body, 'HGMMA', 'HMMA'), count(body, 'MUFU')
        if tensor or mufu:
            print('%#7x-%#7x %8d %6d %5d %5d' % (labels[m.group(1)], addr, len(body), tensor, mufu,
                                                sum(o[1] in ('LDS', 'STS', 'LDSM', 'STSM') for o in body)))
EOF
