#!/usr/bin/env bash
# Regenerates the faithfulness results in docs/faithfulness.md and figures/faithfulness_*.
# Resumable: rerun after an interruption and only unfinished samples are computed.
# CPU cost on 2 shared cores: see docs/faithfulness.md (the numbers there came from this).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONWARNINGS=ignore
RATES="${RATES:-0.3}"
METRICS="${METRICS:-attention,value_weighted,value_weighted_output_normalized,contribution,random}"
.venv/bin/python -m cwlens faithfulness --model smollm2-135m --device cpu \
  --dataset gsm8k,fineweb_edu,mmlu,winogrande,boolq \
  --samples gsm8k=50,fineweb_edu=50,mmlu=100,winogrande=100,boolq=100 \
  --max-tokens 128 --rates "$RATES" --metrics "$METRICS" \
  --out runs/faithfulness --figures figures --summary-md docs/faithfulness.md "$@"
