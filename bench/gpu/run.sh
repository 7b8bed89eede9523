#!/bin/bash
# One GPU session in a fixed time budget: (optionally) the LLaMA-3-8B-shape draft step, the target's replies
# to every ShareGPT train prompt (self-distillation), layer-wise training of the shipped drafter on them with
# the target as online teacher, the chat benchmark with the result, then where a decode step's time goes
# (--profile-step). Each step stops in time for the ones after it, so a loan ends with results on disk.
# docs/training.md has the commands each GPU stage of the shipped drafter ran; each result file its own.
#
# Usage: [DRAFT_STEP=1] [INTER=1536] [SAMPLED=0] [CODE=0] [TASKS=0] [ADD_DATA="a.pt b.pt"] [TRAIN=1] [DRAFT_VOCAB=49152]
#        [BATCH_TOKENS=32768] [TREE=auto] [BF16=1] [RESERVE=210] [PROFILE=1] [METHODS=...] [LIMIT=10]
#        bash bench/gpu/run.sh [BUDGET_SECONDS=585] [OUT_DIR=runs/gpu-session]
# Needs data/train_prompts.pt and data/holdout_prompts.pt (python -m fasteagle.train.data --prompts-out ...).
#   A runs/gpu-drafter/distilled.pt left by an earlier call (or carried to the machine) is reused: delete it
#   to distil again.
#   SAMPLED=1   the target also writes a second reply to every prompt, sampled at temperature 0.7
#               (runs/gpu-replies-s1), and training uses both: more data from the same prompts.
#   CODE=1      the target answers the code prompts of data/code_prompts.pt too (python -m fasteagle.train.data
#               --prompts-out data/code_prompts.pt --code) and training uses those replies: ShareGPT has
#               little code, and HumanEval stays for evaluation.
#   TASKS=1     the target answers the prompts beyond chat of data/task_prompts.pt too (translation,
#               summarization, QA, math, retrieval QA, long documents: python -m fasteagle.train.tasks
#               --prompts-out data/task_prompts.pt), training uses those replies, and a per-category tau
#               (tasks_holdout.jsonl at 6 and 60 nodes) follows the bench.
#   ADD_DATA    more saved token datasets to train on.
#   TRAIN=0     no training: benches the shipped drafter.
#   DRAFT_VOCAB grows the drafter's draft vocabulary (49152: all of SmolLM2's); a bigger head needs more
#               memory in training (BATCH_TOKENS=16384 halves it). A GPU bench drafts over the whole
#               vocabulary anyway (--full-vocab is its default).
#   TREE        auto (default): each drafter at the tree budget that decodes fastest on this GPU (up to 192
#               nodes); fixed: the paper's ~60 nodes.
#   BF16=1      also benches a bf16 target, what a deployment runs; bf16 rounds a tree's forward differently
#               from a one-token step, so an output may leave vanilla's where its top two logits nearly tie.
#   RESERVE     seconds kept after training for loading, the evaluations, the bench and the profile; the
#               [t=...] lines of a run's log show what each took, so size it from the last one.
#   PROFILE=0   skips the profile; METHODS replaces the chat bench's methods; LIMIT its number of prompts.
set -u
PY=${PYTHON:-python3}
B=${1:-585}
OUT=${2:-runs/gpu-session}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# 1. one draft step of each drafter at the LLaMA-3-8B shape (random weights)
if [ "${DRAFT_STEP:-1}" = 1 ]; then
  timeout 75 $PY -m fasteagle bench --draft-step llama3-8b --depths 4,6,8 --device cuda --dtype bf16 \
    --out "$OUT/gpu-draft-step-llama3-8b.json"
  echo "[t=$(el)] draft step done"
fi

# 2. the target's replies to the train prompts, capped at 3 minutes
$PY -m fasteagle train --out runs/gpu-drafter --data data/train_prompts.pt --holdout-data data/holdout_prompts.pt \
  --distill --distill-only --distill-max-new 256 --distill-batch 768 --distill-minutes 3.0 --features online \
  --eval-sequences 60 --device cuda --dtype fp32
echo "[t=$(el)] replies written"

# 2b. a second, fully sampled reply to every prompt (more data, the same prompts)
EXTRA=""
if [ "${SAMPLED:-0}" = 1 ]; then
  $PY -m fasteagle train --out runs/gpu-replies-s1 --data data/train_prompts.pt \
    --holdout-data data/holdout_prompts.pt --distill --distill-only --distill-sample-every 1 --seed 1 \
    --distill-max-new 256 --distill-batch 768 --distill-minutes 3.0 --features online --eval-sequences 60 \
    --device cuda --dtype fp32
  EXTRA="--add-data runs/gpu-replies-s1/distilled.pt"
  echo "[t=$(el)] sampled replies written"
fi
# 2c. the target's replies to code prompts (ShareGPT has little code; HumanEval stays for evaluation)
if [ "${CODE:-0}" = 1 ]; then
  $PY -m fasteagle train --out runs/gpu-replies-code --data data/code_prompts.pt \
    --holdout-data data/holdout_prompts.pt --distill --distill-only --distill-max-new 256 --distill-batch 768 \
    --distill-minutes 2.0 --features online --eval-sequences 60 --device cuda --dtype fp32
  EXTRA="$EXTRA --add-data runs/gpu-replies-code/distilled.pt"
  echo "[t=$(el)] code replies written"
fi
# 2d. the target's replies to prompts beyond chat (ShareGPT users rarely ask for a translation or a summary)
if [ "${TASKS:-0}" = 1 ]; then
  $PY -m fasteagle train --out runs/gpu-replies-tasks --data data/task_prompts.pt \
    --holdout-data data/holdout_prompts.pt --distill --distill-only --distill-max-new 256 --distill-batch 256 \
    --distill-minutes 2.0 --prompt-tail 4096 --features online --eval-sequences 60 --device cuda --dtype fp32
  EXTRA="$EXTRA --add-data runs/gpu-replies-tasks/distilled.pt"
  echo "[t=$(el)] task replies written"
fi
for f in ${ADD_DATA:-}; do EXTRA="$EXTRA --add-data $f"; done

# 3. training: what is left after RESERVE seconds kept for the bench, the profile, loading and the two evaluations
R=${RESERVE:-210}
TRN=$($PY -c "print(round(max(0.5, $B - $(el) - $R) / 60, 2))")
[ "${TRAIN:-1}" = 1 ] && echo "[t=$(el)] train $TRN min" && \
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 timeout $(( B - $(el) - R + 45 )) $PY -m fasteagle train --out runs/gpu-drafter \
  --config assets/drafters/smollm2-135m-fasteagle/configs/gpu.json --data data/train_prompts.pt \
  --holdout-data data/holdout_prompts.pt --distill --distill-max-new 256 --distill-batch 768 --features online \
  --init-from assets/drafters/smollm2-135m-fasteagle --intermediate "${INTER:-1536}" --lr 4e-4 --warmup 30 \
  --batch-tokens "${BATCH_TOKENS:-32768}" --epochs 100 --minutes "$TRN" --device cuda --dtype fp32 $EXTRA \
  ${DRAFT_VOCAB:+--draft-vocab "$DRAFT_VOCAB"}
DR=assets/drafters/smollm2-135m-fasteagle
[ -f runs/gpu-drafter/config.json ] && DR=runs/gpu-drafter
echo "[t=$(el)] bench with $DR"

# 4. 10 chat prompts, every method interleaved prompt by prompt, fp32 so the lossless check is exact;
# fasteagle replays its draft step as a CUDA graph, fasteagle-eager runs it op by op
timeout $(( B - $(el) - 40 )) $PY -m fasteagle bench --prompts assets/prompts/sharegpt_holdout.jsonl --limit "${LIMIT:-10}" \
  --methods "${METHODS:-vanilla,hf-generate,hf-prompt-lookup,eagle3,fasteagle,fasteagle-eager,fasteagle+lookup}" \
  --max-new-tokens 128 --device cuda --dtype fp32 --drafter "$DR" --out "$OUT/gpu-smollm2-135m-chat10.json" \
  --tree "${TREE:-auto}"
echo "[t=$(el)] bench done"
if [ "${BF16:-0}" = 1 ]; then
  timeout $(( B - $(el) - 40 )) $PY -m fasteagle bench --prompts assets/prompts/sharegpt_holdout.jsonl --limit "${LIMIT:-10}" \
    --methods vanilla,hf-generate,eagle3,fasteagle,fasteagle+lookup --max-new-tokens 128 --device cuda --dtype bf16 \
    --drafter "$DR" --out "$OUT/gpu-smollm2-135m-chat10-bf16.json" --tree "${TREE:-auto}"
  echo "[t=$(el)] bf16 bench done"
fi

# 4b. tau per prompt category (translation, summarization, QA, math, retrieval QA, chat) with the drafter trained above
if [ "${TASKS:-0}" = 1 ]; then
  timeout $(( B - $(el) - 30 )) $PY -m fasteagle bench --prompts assets/prompts/tasks_holdout.jsonl --methods fasteagle \
    --budget-curve 6,60 --max-new-tokens 64 --device cuda --dtype fp32 --drafter "$DR" \
    --out "$OUT/gpu-smollm2-135m-tasks144-tau.json"
  echo "[t=$(el)] per-category tau done"
fi

# 5. where the step's time goes: per phase ms and dispatched ops
[ "${PROFILE:-1}" = 1 ] && timeout $(( B - $(el) - 5 )) $PY -m fasteagle bench --profile-step \
  --prompts assets/prompts/sharegpt_holdout.jsonl --limit 3 --methods vanilla,fasteagle,fasteagle-eager,eagle3 \
  --max-new-tokens 64 --device cuda --dtype fp32 \
  --drafter "$DR" --out "$OUT/gpu-smollm2-135m-profile.json"
echo "[t=$(el)] all done"
