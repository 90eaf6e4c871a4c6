"""Today's fused kernel against the one of an earlier commit, side by side: the `cpu` target's pass over T new tokens
(batch 1, `--context` tokens cached) for each precision, the two kernels in turn within each round (`--rounds`), medians
of the kernel's own passes (`FusedPass.time_passes`), on the threads torch has. Timings: run it on a machine doing nothing else.

    python tools/kernel_ab.py --rev bd08642 --precision fp16,int8 --json nbs/bench/attn_ab_cpu_<kind>.json
"""
import argparse, ctypes, json, statistics, subprocess, sys, time
from pathlib import Path
import torch
from smallem_spec import fused as F
from smallem_spec.fast import FastSmallem, _interleave
from smallem_spec.train import load_or_train

def kernel_at(rev:str):
    "The fused kernel's C source as commit `rev` exported it, compiled for this machine and loaded."
    src = subprocess.run(['git', 'show', f'{rev}:smallem_spec/fused.py'], capture_output=True, text=True)
    if src.returncode: sys.exit(f"kernel_ab: no smallem_spec/fused.py at {rev!r} ({src.stderr.strip()})")
    lines = src.stdout.splitlines(keepends=True)
    a = next(i for i, l in enumerate(lines) if l.startswith('_SRC_HEAD = ')); b = next(i for i, l in enumerate(lines) if l.startswith('KERNEL_SRC = '))
    ns = {}; exec(''.join(lines[a:b + 1]), ns)
    out = Path(f'/tmp/smallem_kernel_{rev}.so'); F._build(ns['KERNEL_SRC'], out, 'gcc')
    return F._bind(ctypes.CDLL(str(out)))

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rev', required=True); p.add_argument('--precision', default='fp16,int8')
    p.add_argument('--T', default='1,2,3,4,5,8'); p.add_argument('--context', type=int, default=200)
    p.add_argument('--rounds', type=int, default=7); p.add_argument('--reps', type=int, default=60); p.add_argument('--json', default=None)
    a = p.parse_args(argv)
    Ts = [int(t) for t in a.T.split(',')]
    libs = {a.rev: kernel_at(a.rev), 'today': F.load_kernel(required=True)}
    target = load_or_train('cpu', 'target', progress=False); V = target.cfg.vocab_size
    perm = _interleave(target.cfg.n_heads, target.cfg.head_dim)
    res = {}
    for prec in a.precision.split(','):
        fast = FastSmallem(target, precision=prec)   # its cache; each kernel gets its own packed weights, as the library packs them
        passes = {n: F.FusedPass(target, perm, lib=lib, half=fast.fused.half, int8=fast.fused.int8) for n, lib in libs.items()}
        g = torch.Generator().manual_seed(0)
        cache = fast.new_cache(batch=1); s = [cache.new_seq()]
        with torch.inference_mode():
            fast(torch.randint(1, V, (1, a.context), generator=g), cache, s); cache.append(s, [max(Ts)])
            toks = [torch.randint(1, V, (1, T), generator=g) for T in Ts]
            runs = {n: {T: [] for T in Ts} for n in passes}
            for _ in range(a.rounds):
                for n, fp in passes.items():
                    for T, t in zip(Ts, fp.time_passes(cache, s, [a.context], toks, reps=a.reps)): runs[n][T].append(t * 1e6)
        cache.keep(s[0], a.context)
        med = {n: {T: statistics.median(v) for T, v in d.items()} for n, d in runs.items()}
        res[prec] = {'pass_us_median': {n: {str(T): round(v, 1) for T, v in d.items()} for n, d in med.items()},
                     'pass_us_rounds': {n: {str(T): [round(x, 1) for x in v] for T, v in d.items()} for n, d in runs.items()}}
        for n, d in med.items():
            print(f"{prec:5s} {n:8s}" + ''.join(f"  t({T}) {d[T]:6.1f}" for T in Ts) + f"   v(3) {d[4] / d[1]:.2f}, {(d[4] - d[1]) / 3:.0f} µs a row more" if 4 in d and 1 in d else '')
        o, nw = med[a.rev], med['today']
        print(f"{prec:5s} today / {a.rev}:" + ''.join(f"  T={T}: {nw[T] / o[T]:.2f}" for T in Ts), flush=True)
    out = {'command': 'python tools/kernel_ab.py ' + ' '.join(argv if argv is not None else sys.argv[1:]), 'cpu': F.cpu_info(),
           'threads': torch.get_num_threads(), 'when': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'context': a.context,
           'rounds': a.rounds, 'rev': a.rev, 'precisions': res}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + '\n'); print('wrote', a.json)

if __name__ == '__main__': main()
