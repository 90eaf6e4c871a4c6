"""Paired rows of two versions of the adaptive policy, side by side in one process on one machine.

    python tools/policy_ab.py --before 655b81f [--proposers mtp,draft2,ngram,draft4,mtp_v1024] [--repeats 10]

`--before`: a git revision whose `smallem_spec/cost.py` holds the other `AdaptiveK` (read with `git show`, nothing checked
out); the working tree's is the "after". Each repeat runs, for every proposer and temperature, the adaptive row of both
versions one after the other (which goes first alternates), then fixed k rows for reference: 8 prompts x 200 tokens,
batch 1, each policy first decoding 4 held-out texts untimed (as `smallem_bench`), each row with its own paired plain
decoding (`run_config(paired=)`). Run it on a machine doing nothing else. Writes `nbs/bench/policy_ab_cpu_<kind>.json`.
"""
import argparse, collections, json, os, statistics, subprocess, sys, time, types
from pathlib import Path

def load_old(rev: str, root: Path):
    "The `smallem_spec.cost` module of revision `rev`, imported under another name (its relative imports made absolute)."
    src = subprocess.run(['git', 'show', f'{rev}:smallem_spec/cost.py'], cwd=root, check=True, capture_output=True, text=True).stdout
    mod = types.ModuleType('cost_before'); mod.__file__ = f'{rev}:smallem_spec/cost.py'
    exec(compile(src.replace('from .', 'from smallem_spec.'), mod.__file__, 'exec'), mod.__dict__)
    return mod

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--before', required=True); ap.add_argument('--proposers', default='mtp,draft2,ngram,draft4,mtp_v1024')
    ap.add_argument('--temperatures', default='0,1'); ap.add_argument('--repeats', type=int, default=10)
    ap.add_argument('--fixed', default='3', help='fixed k rows for reference (comma-separated, empty for none)')
    ap.add_argument('--out', default=None)
    a = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    import torch
    import smallem_spec.bench as B
    from smallem_spec.cost import AdaptiveK
    from smallem_spec.fast import FastSmallem
    from smallem_spec.train import load_or_train
    from smallem_spec.corpus import validation_prompts
    from smallem_spec.fused import cpu_info
    from tqdm.auto import tqdm
    old = load_old(a.before, root)
    props, Ts = a.proposers.split(','), [float(t) for t in a.temperatures.split(',')]
    fixed = [int(k) for k in a.fixed.split(',') if k]
    target = FastSmallem(load_or_train('cpu', 'target'))
    models = {m: FastSmallem(load_or_train('cpu', m)) for m in ('draft2', 'draft4') if any(p.startswith(m) for p in props)}
    prompts = validation_prompts('cpu', n=8, length=32); held = validation_prompts('cpu', n=8, length=32, offset=0.5)[:4]
    new_tokens, load0 = 200, os.getloadavg()
    for p in props: B.run_config(target, models, prompts[:1], 8, p, 2, 0.0, 1, None)   # warm-up
    costs = B.measure_costs(target, models, props, 1, B.ADAPTIVE_KMAX, prompts, tuple(Ts), 1, 'cpu', min(32 + new_tokens // 2, target.cfg.max_seq_len - B.ADAPTIVE_KMAX - 2),
                            (min(48, max(16, new_tokens // 4)), max(96, new_tokens)))   # as `bench` prices a run of this size
    versions = {'before': old.AdaptiveK, 'after': AdaptiveK}
    rows, t0 = collections.defaultdict(list), time.time()
    def speed(res):
        b = res.pop('base_halves'); base = sum(x['tokens'] for x in b) / sum(x['seconds'] for x in b)
        return res['tokens'] / res['seconds'] / base
    real = B.AdaptiveK
    try:
        for r in tqdm(range(a.repeats), desc='repeats'):
            for T in Ts:
                for p in props:
                    for name in (list(versions) if r % 2 == 0 else list(versions)[::-1]):
                        B.AdaptiveK = versions[name]
                        res = B.run_config(target, models, prompts, new_tokens, p, 'adaptive', T, 1, costs, seed=r, paired=target, prime=held)
                        rows[(p, T, name)].append([round(speed(res), 4), round(statistics.mean(res['stats'].k_used), 3)])
                    B.AdaptiveK = real
                    for k in fixed:
                        res = B.run_config(target, models, prompts, new_tokens, p, k, T, 1, costs, seed=r, paired=target)
                        rows[(p, T, f'k={k}')].append([round(speed(res), 4), k])
    finally: B.AdaptiveK = real
    after = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(['git', 'status', '--porcelain', 'smallem_spec/cost.py'], cwd=root, capture_output=True, text=True).stdout.strip())
    info = cpu_info()
    out = dict(meta=dict(command='python tools/policy_ab.py ' + ' '.join(sys.argv[1:]), cpu=info['model'], cpu_info=info,
                         torch=torch.__version__, threads=torch.get_num_threads(), before=a.before, after=after + ('+changes' if dirty else ''),
                         when=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0)) + ' to ' + time.strftime('%H:%M UTC', time.gmtime()),
                         size='8 prompts x 200 tokens, batch 1, 4 held-out texts decoded first by each adaptive policy',
                         loadavg=dict(start=[round(x, 2) for x in load0], end=[round(x, 2) for x in os.getloadavg()]),   # this run's own threads count: about its thread number
                         note='each row: [speed-up over its own paired plain decoding, mean k]; to be run with nothing else on the machine'),
               rows=[dict(proposer=p, temperature=T, version=n, runs=v) for (p, T, n), v in rows.items()])
    path = Path(a.out) if a.out else root / 'nbs' / 'bench' / f"policy_ab_cpu_{info['kind']}.json"
    path.write_text(json.dumps(out, indent=1) + '\n')
    for p in props:
        for T in Ts:
            print(p, T, ' | '.join(f"{n} {statistics.median(x for x, _ in rows[(p, T, n)]):.3f}" for n in list(versions) + [f'k={k}' for k in fixed]))
    print('wrote', path)

if __name__ == '__main__': main()
