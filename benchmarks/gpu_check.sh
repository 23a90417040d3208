#!/usr/bin/env bash
# Every GPU measurement of issue 29 in one go, under 6 minutes: run it first when a GPU is lent.
#   bash benchmarks/gpu_check.sh                 # on CUDA; OUT defaults to $TMPDIR/gputui-gpu-check-out
#   GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh   # a dry run on the CPU (small sizes), as
#                                                # tests/test_gpu_check.py does so that it cannot rot
# Environment: PY (python; default .venv/bin/python, else python3), OUT (results; on a lent device
# machine its $OUT, so the files come back), GPU_CHECK_DATA
# (an MNIST directory for every step; default the bundled one), GPU_CHECK_BUDGET_S (default 330).
# Each step has its own timeout (capped by what is left of the budget); a step that fails or
# times out is recorded in steps.txt and the rest still run. summary.txt comes last: each figure
# beside its target (benchmarks/gpu_check_summary.py).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ -z "${PY:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
DEVICE=${GPU_CHECK_DEVICE:-cuda}
OUT=${OUT:-${TMPDIR:-/tmp}/gputui-gpu-check-out}
BUDGET=${GPU_CHECK_BUDGET_S:-330}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gputui-gpu-check.XXXXXX")
# The benchmark scripts import gputui from this tree (on a lent machine nothing installs it; run as
# `python benchmarks/x.py`, their own folder is first on sys.path, not the tree's root).
export PYTHONUNBUFFERED=1 GPUTUI_HOME="$WORK/home" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
DATA_ARGS=()
[ -n "${GPU_CHECK_DATA:-}" ] && DATA_ARGS=(--data "$GPU_CHECK_DATA")
if [ "$DEVICE" = cpu ]; then  # dry run: every step, small sizes
  STEPS=20 SEEDS=(1) SEED_EPOCHS=(--epochs 1) LONG_EPOCHS=2 CAP_LONG=120 CAP_T99=240
else
  STEPS=300 SEEDS=(1 2 3) SEED_EPOCHS=() LONG_EPOCHS=60 CAP_LONG=90 CAP_T99=150
fi
T0=$(date +%s)
: > "$OUT/steps.txt"
echo "device=$DEVICE budget=${BUDGET}s commit=$(git rev-parse --short HEAD 2>/dev/null)" > "$OUT/meta.txt"

# step NAME CAP CMD...: stdout -> NAME.out, stderr -> NAME.err, "NAME rc seconds" -> steps.txt
step() {
  local name=$1 cap=$2 left t0 rc
  shift 2
  left=$(( BUDGET - ($(date +%s) - T0) ))
  if [ "$left" -lt 10 ]; then echo "$name skipped 0 (budget spent)" >> "$OUT/steps.txt"; return 0; fi
  [ "$cap" -gt "$left" ] && cap=$left
  t0=$(date +%s.%N)
  timeout -k 5 "$cap" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err" < /dev/null
  rc=$?
  awk -v n="$name" -v rc="$rc" -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%s %s %.1f\n", n, rc, b - a }' >> "$OUT/steps.txt"
  return 0
}

step env 20 bash -c "nvidia-smi 2>&1 || echo 'no nvidia-smi'; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())'"
step graph 60 "$PY" benchmarks/gpu_check_graph.py "$OUT/graph.json" --device "$DEVICE" --steps "$STEPS" "${DATA_ARGS[@]}"
step time_to_99 "$CAP_T99" "$PY" benchmarks/time_to_99.py --device "$DEVICE" --seeds "${SEEDS[@]}" "${DATA_ARGS[@]}"
step seed_run 30 "$PY" -m gputui run --json --model seed --device "$DEVICE" --run-dir "$WORK/seed" "${SEED_EPOCHS[@]}" "${DATA_ARGS[@]}"
step fast_run 30 "$PY" -m gputui run --json --model fast --device "$DEVICE" --run-dir "$WORK/fast" "${DATA_ARGS[@]}"
step seed_long_nvml "$CAP_LONG" "$PY" benchmarks/gpu_check_nvml.py --device "$DEVICE" --epochs "$LONG_EPOCHS" \
  --run-dir "$WORK/long" "${DATA_ARGS[@]}"
step pytest 120 "$PY" -m pytest -q -p no:cacheprovider -n 0 -m gpu tests/test_gpu.py tests/test_graphstep.py -rs
"$PY" benchmarks/gpu_check_summary.py "$OUT" --device "$DEVICE" > "$OUT/summary.txt" 2> "$OUT/summary.err"
cat "$OUT/summary.txt"
rm -rf "$WORK"
