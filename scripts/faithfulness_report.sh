#!/usr/bin/env bash
# Regenerates the faithfulness results: runs/faithfulness/*.jsonl, figures/faithfulness_*,
# and the tables in docs/faithfulness.md. Resumable: rerun after an
# interruption and only unfinished samples are computed. The settings live in
# cwlens/cli/figures.py (FAITHFULNESS); about an hour on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONWARNINGS=ignore
bash scripts/setup.sh
.venv/bin/cwlens figures --only faithfulness --device cpu "$@"
