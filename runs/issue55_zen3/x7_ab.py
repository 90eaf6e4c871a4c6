"""Seven bits of x against eight on plain AVX2, side by side (issue 55): the int8 `cpu` target's pass over T = 1 .. 8 new
tokens (200 cached, batch 1) on the committed kernel before this change (eight-bit rows with the sign trick, four rows a
block: `git show 1bba2da:smallem_spec/fused.py`) and on today's (seven-bit rows, three a block), the two kernels in turn
within each round, `rounds` rounds; medians of the kernel's own passes (`time_passes`), 2 threads.

    python runs/issue55_zen3/x7_ab.py nbs/bench/int8_x7_ab_cpu_amd-zen3.json | tee runs/issue55_zen3/x7_ab_cpu_amd-zen3.txt
"""
import json, statistics, sys, time
from pathlib import Path
import torch
from smallem_spec import fused as F
from smallem_spec.fast import FastSmallem, _interleave
from smallem_spec.train import load_or_train

sys.path.insert(0, 'tools'); from kernel_ab import kernel_at   # the kernel as commit 1bba2da exported it
libs = {'eight bits, sign trick (1bba2da)': kernel_at('1bba2da'), 'seven bits (today)': F.load_kernel(required=True)}
assert libs['eight bits, sign trick (1bba2da)'].smallem_int8_kind() == 1 and F.int8_levels() == 63
target = load_or_train('cpu', 'target', progress=False)
fast = FastSmallem(target, precision='int8')   # its cache and layout; each kernel gets its own packed weights
perm = _interleave(target.cfg.n_heads, target.cfg.head_dim)
passes = {n: F.FusedPass(target, perm, lib=lib, int8=True) for n, lib in libs.items()}
Ts, rounds, ctx = (1, 2, 3, 4, 5, 8), 7, 200
g = torch.Generator().manual_seed(0); V = target.cfg.vocab_size
cache = fast.new_cache(batch=1); s = [cache.new_seq()]
with torch.inference_mode():
    fast(torch.randint(1, V, (1, ctx), generator=g), cache, s)
    cache.append(s, [max(Ts)])
    toks = [torch.randint(1, V, (1, T), generator=g) for T in Ts]
    res = {n: {T: [] for T in Ts} for n in passes}
    for r in range(rounds):
        for n, fp in passes.items():
            for T, t in zip(Ts, fp.time_passes(cache, s, [ctx], toks, reps=60)): res[n][T].append(t * 1e6)
cache.keep(s[0], ctx)
med = {n: {T: statistics.median(v) for T, v in d.items()} for n, d in res.items()}
for n, d in med.items():
    print(f"{n:34s} " + '  '.join(f"t({T}) {d[T]:6.1f}" for T in Ts) + f"   v(3) {d[4] / d[1]:.2f}, per extra row {(d[4] - d[1]) / 3:.0f} µs")
o, nw = med.values()
print('seven bits / eight bits: ' + '  '.join(f"T={T}: {nw[T] / o[T]:.2f}" for T in Ts))
json.dump({'command': 'python runs/issue55_zen3/x7_ab.py ' + ' '.join(sys.argv[1:]), 'cpu': F.cpu_info(), 'threads': torch.get_num_threads(),
           'when': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'context': ctx, 'rounds': rounds,
           'pass_us_median': {n: {str(T): round(v, 1) for T, v in d.items()} for n, d in med.items()},
           'pass_us_rounds': {n: {str(T): [round(x, 1) for x in v] for T, v in d.items()} for n, d in res.items()}},
          open(sys.argv[1], 'w'), indent=1)
