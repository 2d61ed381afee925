#!/usr/bin/env bash
# The CUDA paths, run on a GPU in one go and timed: the demo pipeline (every decoder, train.amp=auto), the demo's soft
# recipe in full, the paper-size LSTM step against the tutorial's (fp32, compiled, bf16), torchrun with NCCL,
# train.amp false / auto / auto + train.compile, decode.compile (CUDA graphs), and the scaling and feature-caching
# benchmarks. Each step has a time limit and the whole a budget (the first argument, seconds; default 600): steps come
# in the order of what they prove, and those that no longer fit are skipped with a line. Logs and JSON go to $OUT
# (default runs/cuda_check); steps.txt there lists each step's exit status and seconds. SKIP names steps to leave out
# (a rerun after a partial check). scripts/cuda_check_result.py gathers the folder (or a check's and its rerun's)
# into benchmarks/results/cuda_check.json, which docs/results.md renders.
#
#     scripts/cuda_check.sh [BUDGET_SECONDS]          # PY=python3 to use another interpreter than .venv's
#     SKIP="demo_fast bench_decoder" scripts/cuda_check.sh 500
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/cuda_check}
PY=${PY:-.venv/bin/python}
WORK=$(mktemp -d)
budget=${1:-600}
mkdir -p "$OUT"
: > "$OUT/steps.txt"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1

step() {   # step NAME LIMIT_SECONDS COMMAND...: run it with its output in $OUT/NAME.log, unless the budget is spent
    local name=$1 limit=$2 left=$((budget - SECONDS)) started=$SECONDS rc
    shift 2
    if [[ " ${SKIP:-} " == *" $name "* ]]; then echo "$name: skipped (SKIP)" | tee -a "$OUT/steps.txt"; return; fi
    if ((left < 15)); then echo "$name: skipped (budget spent)" | tee -a "$OUT/steps.txt"; return; fi
    ((limit > left)) && limit=$left
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc in $((SECONDS - started)) s (limit $limit s)" | tee -a "$OUT/steps.txt"
}
captioner=("$PY" -m captioner)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}   # the benchmarks import captioner from this checkout

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c 'import torch, platform; print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), "bf16", torch.cuda.is_bf16_supported())'
  lscpu | grep -E "Model name|^CPU\(s\)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

step demo_fast 120 "${captioner[@]}" demo --fast --out "$WORK/fast"
step bench_decoder 150 "$PY" benchmarks/bench_decoder.py --device cuda --only training beam --pairs 5
cp benchmarks/results/lstm_decoder.json "$OUT/" 2>/dev/null
step demo_soft 240 "${captioner[@]}" demo --runs soft --out "$WORK/demo"
soft=$WORK/demo/soft
step torchrun_nccl 60 "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 -m captioner train \
    "$soft/config.yaml" run.out="$WORK/ddp" train.epochs=1
for variant in "fp32 train.amp=false" "amp_auto train.amp=auto" "amp_auto_compiled train.amp=auto train.compile=true"; do
    set -- $variant
    name=$1
    shift
    step "train_$name" 90 "${captioner[@]}" train "$soft/config.yaml" run.out="$WORK/$name" train.epochs=2 "$@"
done
for compiled in false true; do
    step "evaluate_decode_compile_$compiled" 60 "${captioner[@]}" evaluate "$soft/best.pt" --split test \
        --out "$WORK/evaluate_$compiled" decode.compile=$compiled
    cp "$WORK/evaluate_$compiled/scores_test.json" "$OUT/scores_test_decode_compile_$compiled.json" 2>/dev/null
done
step bench_scaling 120 "$PY" benchmarks/bench_scaling.py --quick --device cuda
cp benchmarks/results/scaling.json "$OUT/" 2>/dev/null
step bench_feature_cache 90 "$PY" benchmarks/bench_feature_cache.py --quick --device cuda
cp benchmarks/results/feature_cache.json "$OUT/" 2>/dev/null
cp "$WORK/demo/summary.json" "$OUT/demo_summary.json" 2>/dev/null
grep -h -E "device:|precision:|world:|trained and scored|Traceback|Error" "$OUT"/*.log | sort | uniq -c | sort -rn | head -30
cat "$OUT/steps.txt"
