#!/bin/bash
# One GPU session in a fixed time budget: (optionally) the LLaMA-3-8B-shape draft step, the target's replies
# to every ShareGPT train prompt (self-distillation), layer-wise training of the shipped drafter on them with
# the target as online teacher, and the chat benchmark with the result. The H200 results in
# bench/results/gpu-h200-* and the stage-9 and stage-10 drafters were made this way (stage 10:
# `DRAFT_STEP=0 INTER=1536 bash bench/gpu/run.sh 720`, its steps run as separate device calls of one loan).
#
# Usage: [DRAFT_STEP=1] [INTER=1536] bash bench/gpu/run.sh [BUDGET_SECONDS=585] [OUT_DIR=runs/gpu-session]
# Needs data/train_prompts.pt and data/holdout_prompts.pt (python -m fasteagle.train.data --prompts-out ...).
# A runs/gpu-drafter/distilled.pt left by an earlier call is reused (delete it to distil again).
set -u
B=${1:-585}
OUT=${2:-runs/gpu-session}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# 1. one draft step of each drafter at the LLaMA-3-8B shape (random weights)
if [ "${DRAFT_STEP:-1}" = 1 ]; then
  timeout 75 python -m fasteagle bench --draft-step llama3-8b --depths 4,6,8 --device cuda --dtype bf16 \
    --out "$OUT/gpu-draft-step-llama3-8b.json"
  echo "[t=$(el)] draft step done"
fi

# 2. the target's replies (about 170 s for the 14689 train prompts on an H200)
python -m fasteagle train --out runs/gpu-drafter --data data/train_prompts.pt --holdout-data data/holdout_prompts.pt \
  --distill --distill-only --distill-max-new 256 --distill-batch 768 --distill-minutes 3.0 --features online \
  --eval-sequences 60 --device cuda --dtype fp32
echo "[t=$(el)] replies written"

# 3. training: what is left after ~130 s kept for the bench and 40 s for loading and the two evaluations
TRN=$(python -c "print(round(max(0.5, $B - $(el) - 170) / 60, 2))")
echo "[t=$(el)] train $TRN min"
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 timeout $(( B - $(el) - 125 )) python -m fasteagle train --out runs/gpu-drafter \
  --config assets/drafters/smollm2-135m-fasteagle/train_stage10.json --data data/train_prompts.pt \
  --holdout-data data/holdout_prompts.pt --distill --distill-max-new 256 --distill-batch 768 --features online \
  --init-from assets/drafters/smollm2-135m-fasteagle --intermediate "${INTER:-1536}" --lr 4e-4 --warmup 30 \
  --batch-tokens 32768 --epochs 100 --minutes "$TRN" --device cuda --dtype fp32
DR=assets/drafters/smollm2-135m-fasteagle
[ -f runs/gpu-drafter/config.json ] && DR=runs/gpu-drafter
echo "[t=$(el)] bench with $DR"

# 4. 10 chat prompts, every method interleaved prompt by prompt, fp32 so the lossless check is exact
timeout $(( B - $(el) - 5 )) python -m fasteagle bench --prompts assets/prompts/sharegpt_holdout.jsonl --limit 10 \
  --methods vanilla,hf-generate,hf-prompt-lookup,eagle3,fasteagle,fasteagle+lookup --max-new-tokens 128 \
  --device cuda --dtype fp32 --drafter "$DR" --out "$OUT/gpu-smollm2-135m-chat10.json"
echo "[t=$(el)] all done"
