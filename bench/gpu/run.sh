#!/bin/bash
# One GPU session in a fixed time budget: the LLaMA-3-8B-shape draft step, a drafter trained for the
# default target (self-distillation of every ShareGPT train prompt, then layer-wise training with the
# target as online teacher), and the chat benchmark with it. This is how the H200 results in
# bench/results/gpu-h200-* and the stage-9 drafter were made (`bash bench/gpu/run.sh 585`).
#
# Usage: bash bench/gpu/run.sh [BUDGET_SECONDS=585] [OUT_DIR=runs/gpu-session]
# Needs data/train_prompts.pt and data/holdout_prompts.pt (python -m fasteagle.train.data --prompts-out ...).
set -u
B=${1:-585}
OUT=${2:-runs/gpu-session}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# 1. one draft step of each drafter at the LLaMA-3-8B shape (random weights)
timeout 75 python -m fasteagle bench --draft-step llama3-8b --depths 4,6,8 --device cuda --dtype bf16 \
  --out "$OUT/gpu-draft-step-llama3-8b.json"
echo "[t=$(el)] draft step done"

# 2. training: the time left after ~125 s kept for the bench is split 42 / 58 between distillation and
#    training (45 s go to loading, the holdout and the evaluations)
LEFT=$(( B - $(el) - 125 ))
DIST=$(python -c "print(round(max(0.5, ($LEFT - 45) * 0.42) / 60, 2))")
TRN=$(python -c "print(round(max(0.5, ($LEFT - 45) * 0.58) / 60, 2))")
echo "[t=$(el)] train window $LEFT s: distill $DIST min, train $TRN min"
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 timeout "$LEFT" python -m fasteagle train --out runs/gpu-drafter \
  --config assets/drafters/smollm2-135m-fasteagle/train_stage9.json --data data/train_prompts.pt \
  --holdout-data data/holdout_prompts.pt --distill --distill-max-new 256 --distill-batch 768 \
  --distill-minutes "$DIST" --features online --init-from assets/drafters/smollm2-135m-fasteagle --lr 4e-4 \
  --warmup 30 --batch-tokens 32768 --epochs 100 --minutes "$TRN" --device cuda --dtype fp32
DR=assets/drafters/smollm2-135m-fasteagle
[ -f runs/gpu-drafter/config.json ] && DR=runs/gpu-drafter
echo "[t=$(el)] bench with $DR"

# 3. 10 chat prompts, every method interleaved prompt by prompt, fp32 so the lossless check is exact
timeout $(( B - $(el) - 5 )) python -m fasteagle bench --prompts assets/prompts/sharegpt_holdout.jsonl --limit 10 \
  --methods vanilla,hf-generate,hf-prompt-lookup,eagle3,fasteagle,fasteagle+lookup --max-new-tokens 128 \
  --device cuda --dtype fp32 --drafter "$DR" --out "$OUT/gpu-smollm2-135m-chat10.json"
echo "[t=$(el)] all done"
