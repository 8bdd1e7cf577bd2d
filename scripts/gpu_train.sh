#!/usr/bin/env bash
# scripts/gpu_train.sh — one device call for the training figures on a lent
# GPU: examples/train_gpt against PyTorch on the same model, and the
# longest sequence that trains with 8 ranks sharing the GPU.
#
#   scripts/gpu_train.sh [--dry-run] [--prebuilt DIR] [--peak-tflops X] [BUDGET_SECONDS]
#
# The model is GPT-2-small-sized: 12 layers, d = 768, 12 heads (kv heads
# 12), ffn 3,072, train_gpt's byte vocabulary, bf16 (fp32 master weights
# and moments), on the shipped corpus.
#   1. train_gpt --backend cuda --dtype bf16 at S = 8,192, B = 1, one rank:
#      its step lines' tokens a second and MFU (against --peak-tflops X,
#      default 989.4: H100 and H200 SXM, bf16 dense), its peak memory.
#   2. bench/train_gpt_sdpa.py, the same model in PyTorch (fp32 parameters
#      under bf16 autocast, fused AdamW), SDPA on its cuDNN backend, then on
#      FlashAttention-2; skipped without PyTorch.
#   3. train_gpt with 8 ranks on the one GPU (cp 8, striped; the local
#      transport), S = 16,384 doubling while two steps train in 150 s, then
#      with --recompute from the first S that did not: the longest S each
#      way.
# Each run has a timeout cut to what is left of BUDGET_SECONDS (default
# 500); give the device call a timeout_s of the budget plus 20.
#   --prebuilt DIR  the programs (default .gpu/build, as scripts/gpu_pack.sh
#                   makes them; the call carries [".deps", ".gpu"]).
#   --dry-run       print what would run, run nothing.
#
# Output in $OUT: summary.txt (a line a run: tokens a second, MFU, peak
# memory, or why it stopped) and train.tgz (every run's whole output).
# Exit status: 0 when step 1 trained, 1 otherwise.
set -u

usage() { sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; }
dry=0
budget=500
build=.gpu/build
peak=989.4
while [ $# -gt 0 ]; do
    case $1 in
    -n | --dry-run) dry=1 ;;
    --prebuilt | --peak-tflops)
        [ $# -ge 2 ] || { echo "gpu_train: $1 needs a value" >&2; exit 2; }
        if [ "$1" = --prebuilt ]; then build=$2; else peak=$2; fi
        shift
        ;;
    -h | --help) usage; exit 0 ;;
    '' | *[!0-9]*) echo "gpu_train: unknown argument '$1' (--help)" >&2; exit 2 ;;
    *) budget=$1 ;;
    esac
    shift
done

cd "$(dirname "$0")/.." || exit 2
out=${OUT:-$PWD/gpu_train_out}
logs=$out/train_logs
summary=$out/summary.txt
train=$build/examples/train_gpt
model="--layers 12 --dim 768 --heads 12 --kv-heads 12 --ffn 3072 --dtype bf16 --backend cuda"
model="$model --sample 0 --peak-tflops $peak --log-every 1"
prefix=${DEPS_PREFIX:-$PWD/.deps/root/usr}   # what scripts/gpu_pack.sh unpacked
export LD_LIBRARY_PATH=$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

if [ "$dry" = 1 ]; then
    echo "1. $train $model --seq 8192 --batch 1 --steps 8"
    echo "2. python3 bench/train_gpt_sdpa.py --seq 8192 --batch 1 --steps 8 --peak-tflops $peak --sdpa cudnn (then flash)"
    echo "3. DT_TRANSPORT=local $train --ranks 8 --cp 8 --order striped $model --seq S --batch 1 --steps 2, S = 16384, 32768, ...; then with --recompute from the first S that failed"
    exit 0
fi
[ -x "$train" ] || { echo "gpu_train: $train is not built (scripts/gpu_pack.sh)" >&2; exit 2; }
mkdir -p "$logs"
: >"$summary"
log() { echo "[$SECONDS s] $*" | tee -a "$summary"; }
left() { echo $((budget - SECONDS)); }
# run NAME SECONDS CMD...: CMD's output in $logs/NAME.log, its exit status
run() {
    local name=$1 t=$2
    shift 2
    [ "$t" -gt 300 ] && t=300
    if [ "$t" -lt 20 ]; then
        log "$name: skipped, $(left) s of the budget left"
        return 124
    fi
    timeout -k 5 "$t" "$@" >"$logs/$name.log" 2>&1
}
# The last step line's tok/s and MFU, and the peak memory line, of a log.
steps_of() {
    local l
    l=$(grep -E '^step ' "$1" | tail -1 | sed -E 's/.*\| +([0-9]+) tok\/s \| MFU +([0-9.]+%).*/\1 tok\/s, MFU \2/')
    echo "${l:-no step line}; $(grep -m1 'peak memory per rank' "$1" | sed 's/^train_gpt: //')"
}

log "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"

run train_gpt_s8192 "$(($(left) - 200))" "$train" $model --seq 8192 --batch 1 --steps 8
rc=$?
first=$rc
log "1. train_gpt S=8192 B=1 bf16 cuda: exit $rc; $(steps_of "$logs/train_gpt_s8192.log")"

if python3 -c 'import torch' 2>/dev/null; then
    for sdpa in cudnn flash; do
        run "torch_$sdpa" "$(($(left) - 150))" python3 bench/train_gpt_sdpa.py --seq 8192 --batch 1 \
            --steps 8 --warmup-steps 3 --peak-tflops "$peak" --sdpa "$sdpa"
        rc=$?
        log "2. PyTorch SDPA $sdpa: exit $rc; $(grep -E '^train_gpt_sdpa: median|^result' "$logs/torch_$sdpa.log" | tail -2 | tr '\n' ' ')"
    done
else
    log "2. PyTorch: skipped, python3 has no torch"
fi

S=16384
for rec in "" --recompute; do
    best=none
    while [ "$(left)" -gt 40 ]; do
        name="cp8_s${S}${rec:+_recompute}"
        run "$name" "$(( $(left) - 10 < 150 ? $(left) - 10 : 150 ))" env DT_TRANSPORT=local \
            "$train" --ranks 8 --cp 8 --order striped $model --seq "$S" --batch 1 --steps 2 $rec
        rc=$?
        log "3. cp 8 striped S=$S ${rec:-(no recompute)}: exit $rc; $(steps_of "$logs/$name.log")"
        [ "$rc" = 0 ] || break
        best=$S
        S=$((S * 2))
    done
    log "3. the longest S that trained on 8 ranks ${rec:-without --recompute}: $best"
done

tar -czf "$out/train.tgz" -C "$out" train_logs 2>/dev/null && rm -rf "$logs"
[ "$first" = 0 ]
