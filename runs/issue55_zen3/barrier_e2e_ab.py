"""The team's own barrier (12a, "Barriers") against the runtime's, end to end: whole generations with the fused kernel
of commit `rev` (before the change) and today's, side by side. Greedy, 8 validation prompts x 200 new tokens, batch 1, on
the `cpu` target's int8 and fp16 panels: plain decoding (k = 0: one call of the library per text) and the MTP module at
k = 2; in each round every case runs on both kernels in turn (which goes first alternates). Tokens/s a run, the paired
ratio per round, its median. Timings: run it on a machine doing nothing else.

    python runs/issue55_zen3/barrier_e2e_ab.py b5649c9 15 nbs/bench/barrier_e2e_ab_cpu_amd-zen3.json
"""
import json, statistics, sys, time
import torch
sys.path.insert(0, 'tools'); from kernel_ab import kernel_at
from smallem_spec import fused as F
from smallem_spec.train import load_or_train
from smallem_spec.fast import FastSmallem
from smallem_spec.generate import generate
from smallem_spec.spec import speculative_generate
from smallem_spec.mtp import MTPProposer
from smallem_spec.corpus import validation_prompts

rev, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
libs = {rev: kernel_at(rev), 'today': F.load_kernel(required=True)}
m = load_or_train('cpu', 'target', progress=False); prompts = validation_prompts('cpu', n=8, length=32)
models = {}
for name, lib in libs.items():   # each model packs its weights for the kernel it is built with
    F._lib = lib
    models[name] = {p: FastSmallem(m, precision=p) for p in ('int8', 'fp16')}
    assert all(x.fused.lib is lib for x in models[name].values())
F._lib = libs['today']
cases = [(p, k) for p in ('int8', 'fp16') for k in (0, 2)]

def run(t, k):
    "Tokens/s of the 8 texts, one after another; the texts themselves (the two kernels must agree)."
    texts, t0 = [], time.perf_counter()
    for p in prompts:
        g = torch.Generator().manual_seed(0)
        texts.append(generate(t, [p], 200, 0.0, g)[0] if k == 0 else speculative_generate(t, MTPProposer(t), [p], 200, k, 0.0, g)[0][0])
    return sum(map(len, texts)) / (time.perf_counter() - t0), texts

res = {(n, c): [] for n in libs for c in cases}
for r in range(rounds):
    for c in cases:
        texts = []
        for n in (list(libs) if r % 2 == 0 else list(libs)[::-1]):
            tps, tx = run(models[n][c[0]], c[1]); res[(n, c)].append(tps); texts.append(tx)
        assert texts[0] == texts[1], c
rows = []
for c in cases:
    o, nw = res[(rev, c)], res[('today', c)]
    ratios = [b / a for a, b in zip(o, nw)]
    rows.append({'precision': c[0], 'k': c[1], 'tokens_per_s': {rev: round(statistics.median(o)), 'today': round(statistics.median(nw))},
                 'paired_ratio_median': round(statistics.median(ratios), 3), 'today_faster_rounds': sum(x > 1 for x in ratios), 'rounds': rounds,
                 'tokens_per_s_rounds': {rev: [round(x) for x in o], 'today': [round(x) for x in nw]}})
    print(f"{c[0]:5s} k={c[1]}  {rev} {statistics.median(o):6.0f} tok/s  today {statistics.median(nw):6.0f}  today / {rev} (paired, median) {statistics.median(ratios):.3f}, faster in {rows[-1]['today_faster_rounds']} of {rounds} rounds")
json.dump({'command': 'python runs/issue55_zen3/barrier_e2e_ab.py ' + ' '.join(sys.argv[1:]), 'cpu': F.cpu_info(), 'threads': torch.get_num_threads(),
           'when': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'rev': rev, 'prompts': len(prompts), 'new_tokens': 200, 'rows': rows},
          open(out, 'w'), indent=1)
print('wrote', out)
