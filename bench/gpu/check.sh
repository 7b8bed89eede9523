#!/bin/bash
# One short GPU loan, measuring only (no training), the most valuable run first, so that what a time limit
# cuts is the least valuable. Each step gets what is left of BUDGET_SECONDS; run.sh is the training session.
#   1. fp32, 30 chat prompts: vanilla, eagle3, fasteagle-equal, fasteagle (tree in the graph) and
#      fasteagle+lookup, each at its best tree (--tree auto), every output checked against vanilla's;
#      then tau at 60 and 128 nodes (replayed, host-independent).
#   2. bf16, the same runs, each reply matched against step 1's fp32 vanilla replies (--reference).
#   3. The LLaMA-3-8B-shape draft step at depths 4, 6 and 8 (random weights, host-independent).
#   4. The GPU tests (tests/test_gpu.py).
#   5. Tau per kind on the task holdout at 6 and 60 nodes, with the shipped drafter.
#
# Usage: bash bench/gpu/check.sh [BUDGET_SECONDS=470] [OUT_DIR=runs/gpu-check]
#        DEVICE=cpu LIMIT=1 MAX_NEW=8 TASK_LIMIT=1 TREE=fixed bash bench/gpu/check.sh 900 /tmp/check  # on a CPU
# Results land in OUT_DIR with the commands that made them; copy them to bench/results/ under dated names.
set -u
PY=${PYTHON:-python3}
B=${1:-470}
OUT=${2:-runs/gpu-check}
DEV=${DEVICE:-cuda}
N=${MAX_NEW:-128}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
step() { echo "[t=$(el)s] $*"; }
run() {  # a command under what is left of the budget; none once it is spent (timeout 0 would never stop)
  local t=$(( B - $(el) ))
  if [ "$t" -lt 10 ]; then step "out of time, skipped: $*"; return 1; fi
  timeout "$t" "$@"
}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15
[ "$DEV" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
CHAT=(--prompts assets/prompts/sharegpt_holdout.jsonl --limit "${LIMIT:-30}" --max-new-tokens "$N" --device "$DEV")
METHODS=vanilla,eagle3,fasteagle-equal,fasteagle,fasteagle+lookup

step "1. fp32 chat"
run $PY -m fasteagle bench "${CHAT[@]}" --methods "$METHODS" --dtype fp32 --tree "${TREE:-auto}" \
  --out "$OUT/chat30-fp32.json"
run $PY -m fasteagle bench "${CHAT[@]}" --methods fasteagle --dtype fp32 --budget-curve 60,128 \
  --out "$OUT/chat30-tau-60-128.json"

step "2. bf16 chat"
REF=()
[ -f "$OUT/chat30-fp32.json" ] && REF=(--reference "$OUT/chat30-fp32.json")
run $PY -m fasteagle bench "${CHAT[@]}" --methods "$METHODS" --dtype bf16 --tree "${TREE:-auto}" "${REF[@]}" \
  --out "$OUT/chat30-bf16.json"

step "3. draft step, LLaMA-3-8B shape"
run $PY -m fasteagle bench --draft-step llama3-8b --depths 4,6,8 --device "$DEV" --dtype bf16 \
  --out "$OUT/draft-step-llama3-8b.json"

step "4. GPU tests"
[ "$DEV" = cuda ] || export FASTEAGLE_TEST_DEVICE="$DEV"
run $PY -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -5

step "5. tau per kind"
run $PY -m fasteagle bench --prompts assets/prompts/tasks_holdout.jsonl --limit "${TASK_LIMIT:-24}" \
  --methods fasteagle --budget-curve 6,60 --max-new-tokens 64 --device "$DEV" --dtype fp32 \
  --out "$OUT/tasks144-tau.json"
step "done"
ls -la "$OUT"
