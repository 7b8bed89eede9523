#!/bin/bash
# One GPU session in a fixed time budget: (optionally) the LLaMA-3-8B-shape draft step, the target's replies
# to every ShareGPT train prompt (self-distillation), layer-wise training of the shipped drafter on them with
# the target as online teacher, and the chat benchmark with the result, then where a decode step's time goes
# (--profile-step). The H200 results in bench/results/gpu-h200-* and the stage-9 to stage-11 drafters were
# made this way (stage 10: `DRAFT_STEP=0 INTER=1536 bash bench/gpu/run.sh 720`; stage 11: `DRAFT_STEP=0
# DRAFT_VOCAB=49152 bash bench/gpu/run.sh 560` on stage 10's carried replies; stage 12: stage 11's replies
# plus a sampled set (the SAMPLED=1 step below, 2.5 min) as ADD_DATA, `bash bench/gpu/run.sh 575`; their
# steps ran as separate device calls of one loan). Stage 14 (new sampled chat replies and the code prompts'
# greedy and sampled replies, then training on those only) ran the commands in docs/training.md instead,
# and its chat bench used --tree-budget 128, the budget --tree auto had chosen on the H200 before. The
# 2026-11-27 chat bench and profile were steps 4 and 5 alone, with LIMIT=30 and
# METHODS=vanilla,hf-generate,eagle3,fasteagle,fasteagle+lookup (290 s and 40 s; the GGUF and the drafters
# had come over in three calls).
#
# Usage: [DRAFT_STEP=1] [INTER=1536] [SAMPLED=0] [CODE=0] [ADD_DATA="a.pt b.pt"] [TRAIN=1] [DRAFT_VOCAB=49152]
#        [BATCH_TOKENS=32768] [TREE=auto] [BF16=1] [RESERVE=210] [PROFILE=1] [METHODS=...] [LIMIT=10]
#        bash bench/gpu/run.sh [BUDGET_SECONDS=585] [OUT_DIR=runs/gpu-session]
# Needs data/train_prompts.pt and data/holdout_prompts.pt (python -m fasteagle.train.data --prompts-out ...).
# A runs/gpu-drafter/distilled.pt left by an earlier call (or carried to the machine) is reused (delete it to
# distil again). SAMPLED=1 also has the target write a second reply to every prompt, sampled at temperature
# 0.7 (runs/gpu-replies-s1, ~170 s for all, 2.5 min gave half), and trains on both; CODE=1 has the target answer
# the code prompts of data/code_prompts.pt too (python -m fasteagle.train.data --prompts-out data/code_prompts.pt
# --code: documented functions of the standard library, networkx and numpy, HumanEval-shaped; runs/gpu-replies-code)
# and trains on those replies as well; ADD_DATA names more saved token datasets to train on.
# TRAIN=0 skips training and benches the shipped drafter. DRAFT_VOCAB grows a drafter's draft vocab (49152:
# SmolLM2's whole vocabulary, which the shipped drafter has drafted over since stage 11); a bigger head
# needs more memory in training (BATCH_TOKENS=16384 halves it). On a GPU every bench drafts over the whole
# vocabulary (--full-vocab is the default there). TREE=auto (default) gives each drafter its best
# tree budget on this GPU (up to 192 nodes), TREE=fixed the ~60 nodes of issue 4. BF16=1 also benches a bf16
# target (the speed a deployment sees; bf16 rounds a 60-node forward differently from a one-token step, so a
# few outputs may differ from vanilla where the target's top two logits nearly tie). RESERVE: seconds kept
# after training for the evaluations, the bench and the profile (TREE=auto with five methods needs ~330 s for
# the evaluations and the bench: stage 12's loan kept 200 and lost its bench to the time limit); PROFILE=0 skips the
# profile; METHODS replaces the chat bench's method list; LIMIT sets its number of chat prompts (30 with five
# methods takes ~290 s on an H200).
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

# 2. the target's replies (about 170 s for the 14689 train prompts on an H200)
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

# 5. where the step's time goes: per phase ms and dispatched ops
[ "${PROFILE:-1}" = 1 ] && timeout $(( B - $(el) - 5 )) $PY -m fasteagle bench --profile-step \
  --prompts assets/prompts/sharegpt_holdout.jsonl --limit 3 --methods vanilla,fasteagle,fasteagle-eager,eagle3 \
  --max-new-tokens 64 --device cuda --dtype fp32 \
  --drafter "$DR" --out "$OUT/gpu-smollm2-135m-profile.json"
echo "[t=$(el)] all done"
