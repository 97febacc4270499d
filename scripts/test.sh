#!/usr/bin/env bash
# The whole test suite (what CI runs): lint, type check (mypy), the import layers
# (import-linter: pyproject.toml [tool.importlinter]), the TransformerLens 4.x
# suite in .venv (unit, integration, the real offline model, notebooks; every cwlens
# function type- and shape-checked at run time by jaxtyping + beartype), then the
# architecture tests again under TransformerLens 3.x in .venv-tl3 (the API examples run as
# doctests in the 4.x suite: tests/test_doctests.py), and the docs site (mkdocs.yml) built
# in strict mode: a broken link, anchor or docstring reference fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONWARNINGS=ignore
echo "== ruff" && .venv/bin/ruff check cwlens tests scripts notebooks
echo "== mypy (config: pyproject.toml [tool.mypy])" && .venv/bin/mypy
echo "== import-linter" && .venv/bin/lint-imports --no-cache
echo "== docs site (mkdocs build --strict)"
site=$(mktemp -d) && trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
export CWLENS_SITE_DIR="$site"   # tests/test_browser_docs.py opens this build (no second build)
echo "== TransformerLens 4.x (TransformerBridge)"
# two workers on two cores, one torch thread each (tests/conftest.py); the tests of one real
# offline model share a worker (--dist loadgroup), so each model loads once; the 20 slowest
# tests are listed at the end (CI time: keep the whole run under 20 minutes)
OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=20 "$@"
if [ -x .venv-tl3/bin/python ]; then
  echo "== TransformerLens 3.x (HookedTransformer)"
  .venv-tl3/bin/python -m pytest -q -p no:cacheprovider tests/test_architectures.py tests/test_geometry.py tests/test_stream.py \
    tests/test_keyset_reducer.py tests/test_blockwise.py \
    tests/test_groundtruth_convert.py tests/test_groundtruth_convert_surfaces.py tests/test_edge_effects.py \
    tests/test_graph.py tests/test_graph_viewer.py
fi
