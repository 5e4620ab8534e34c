#!/usr/bin/env bash
# finetune against TRL's SFTTrainer on one GPU, with a model of Qwen2.5-0.5B's shape built offline (random
# weights, its real 151,936-row vocabulary): tokens/s, MFU and peak GPU memory of each. At most ~8 minutes.
#
#   bash bench/gpu.sh                 # full fine-tuning, 30 steps each (5 of them warm-up)
#   METHOD=lora STEPS=40 bash bench/gpu.sh
#
# Needs a CUDA build of torch and the bench extra (pip install -e '.[bench]': trl, datasets); flash-attn is
# used by both systems when it is installed, SDPA otherwise. See bench/gpu_bench.py for what is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
WORK=${WORK:-$(mktemp -d /tmp/finetune-gpu-XXXX)}
STEPS=${STEPS:-30}
METHOD=${METHOD:-full}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
timeout 90 "$PY" bench/gpu_bench.py --work "$WORK" --conversations 3000          # data, tokenizer, model (~1 GB)
for system in finetune trl; do
  if [ "$system" = trl ] && ! "$PY" -c "import trl, datasets" 2>/dev/null; then
    echo '{"system": "trl", "error": "trl/datasets not installed: pip install -e .[bench]"}'; continue
  fi
  timeout 180 "$PY" bench/gpu_bench.py --work "$WORK" --system "$system" --steps "$STEPS" --method "$METHOD" \
    | tail -n 1 || echo "{\"system\": \"$system\", \"error\": \"failed or timed out (180 s)\"}"
done
echo "work folder: $WORK"
