#!/usr/bin/env bash
# Set up .venv for smallem_spec on a fresh machine. `tools/setup.sh dev` adds the development tools (nbdev, pytest, Jupyter).
# CPU machine: installs the CPU build torch==2.13.0 (never a multi-GB CUDA build).
# GPU machine: keeps the CUDA torch that is already installed (the venv sees it through --system-site-packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "setup: keeping the installed CUDA torch ($($PY -c 'import torch; print(torch.__version__)'))"
    $PY -m venv --system-site-packages .venv
  else
    $PY -m venv .venv
  fi
fi
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip install -q torch                       # a GPU machine without torch: the default (CUDA) build
  else
    pip install -q torch==2.13.0               # the CPU build (a wheel on disk on the project's machines)
  fi
fi
if [ "${1:-}" = dev ]; then
  pip install -q -e ".[dev]"
  # llama.cpp, for the GGUF parity test (tests/test_gguf.py). PyPI has llama-cpp-python only as source (it vendors
  # llama.cpp): pip compiles it for this CPU (-march=native, no GPU backend). Build isolation brings scikit-build-core
  # from PyPI (and cmake when the system has none recent enough); gcc/g++ must be present. Measured 2026-11, 2 cores:
  # 9.7 CPU-minutes of compiling on the Intel Xeon kind (10 m 49 s wall while other jobs loaded the machine);
  # 3 m 48 s wall on a quiet AMD EPYC (issue 20). Nothing to do once installed.
  # --no-cache-dir: never reuse a wheel compiled for another processor from a shared pip cache.
  # LLAVA_BUILD=OFF: not the multimodal library (libmtmd), which the parity test never loads (`from llama_cpp import Llama`
  # and a text model need only libllama and ggml); less to compile on a CI machine.
  if ! python -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '0.3.36')" 2>/dev/null; then
    echo "setup: building llama-cpp-python 0.3.36 from source (about 4 to 10 minutes on 2 cores)"
    CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAVA_BUILD=OFF" pip install -q --no-cache-dir llama-cpp-python==0.3.36
  fi
  # the docs' browser test needs Chromium (Debian's package)
  if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "setup: could not install chromium; the browser tests will be skipped"
  fi
else
  pip install -q -e .
fi
python -c "import torch, smallem_spec; print(f'setup: smallem_spec {smallem_spec.__version__}, torch {torch.__version__}, cuda {torch.cuda.is_available()}')"
