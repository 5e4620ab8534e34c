#!/usr/bin/env bash
# The SmolLM2 demo end to end on this machine's CPU from an empty cache (issue 49's target: <= 20 min wall on 2
# quiet cores, the pull and conversion included), then each stage's device, precision and seconds
# (bench/gpu_stages.py, from the run's stages.jsonl; on a CPU its "a model sat on the CPU" exit is expected).
#
#   bash bench/demo_cpu.sh                       # writes OUT.log, OUT/cpu_stages.json and prints the wall time
#   OUT=/tmp/cpu-demo bash bench/demo_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
WORK=$(mktemp -d /tmp/finetune-cpu-demo-XXXX)
OUT=${OUT:-$WORK/demo}
export FINETUNE_CACHE="$WORK/cache"  # empty: the pull, the conversion and every answer are part of the time
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false

echo "cores: $(nproc); $(uptime)"
started=$(date +%s)
/usr/bin/time -v "$PY" -m finetune demo --base smollm2-135m-instruct --out "$OUT" > "$OUT.log" 2> "$OUT.err" || {
  tail -30 "$OUT.err"; exit 1; }
echo "demo wall time: $(( $(date +%s) - started )) s; $(uptime)"
grep -E "Elapsed|User time|System time|Maximum resident" "$OUT.err"
"$PY" bench/gpu_stages.py "$OUT" --json "$OUT/cpu_stages.json" || true
