"""Token trees on the fused CPU kernel, measured (09a_trees): what a verify pass over a tree of n nodes costs against a
causal pass over n tokens (the kernel's own passes, 200 tokens cached, in turn), and tokens/s of tree rounds against the
same proposer's chains and the target alone, greedy and sampled (`--temperatures`), batch 1, 8 validation prompts x 200
tokens, `--repeats` interleaved runs (each row's speed-up over the target alone's run at its temperature in the same
repeat); greedy text checked against the target alone in every greedy row. Chains run their rounds in the fused library (`12a_fused_cpu`); so do static trees of the MTP module and of
drafters (`FusedPass.tree_rounds`), while dynamic trees run theirs from Python (each row says which).
Shapes '1', '1x1', '1x1x1' are chains grown as trees: beside the chains of 1, 2, 3 guesses they price the tree machinery
alone. Timings: a machine doing nothing else.

    python tools/tree_bench.py --json nbs/bench/tree_fused_cpu_<kind>.json
"""
import argparse, ctypes, json, statistics, sys, time
from pathlib import Path
import torch
from smallem_spec import fused as F
from smallem_spec.fast import FastSmallem
from smallem_spec.generate import generate
from smallem_spec.spec import speculative_generate
from smallem_spec.mtp import make_proposer
from smallem_spec.tree import Tree, tree_generate, make_tree_proposer, roomy_cache, parse_shape, _library_rounds
from smallem_spec.train import load_or_train
from smallem_spec.corpus import validation_prompts

def pass_costs(fast, ns=(2, 4, 8, 16, 32), context=200, rounds=5, reps=60, seed=0):
    "Median µs of the kernel's pass over n causal tokens and over a random tree of n nodes (3 children a node at most), in turn."
    fp, V, g = fast.fused, fast.cfg.vocab_size, torch.Generator().manual_seed(seed)
    cache = roomy_cache(fast, [context + 1], 64); s = [cache.new_seq()]
    fast(torch.randint(1, V, (1, context), generator=g), cache, s); cache.append(s, [max(ns)])
    built = []
    for n in ns:
        par = torch.tensor([[-1] + [(j - 1) // 3 for j in range(1, n)]]); tr = Tree(torch.randint(1, V, (1, n), generator=g), par)
        masks = (tr.anc[:, :, :n].long() << torch.arange(n)).sum(-1).reshape(-1).tolist()
        for kind, tree in (('chain', None), ('tree', ([context], tr.depth.contiguous(), masks))):
            a, *keep = fp._args(cache, s, [context], [n], tr.tokens, 1, n, None, tree)
            built.append((n, kind, F.PassArgs.from_buffer_copy(a), keep))
    for _, _, a, _ in built: a.work = fp.work.data_ptr()
    ts = {(n, k): [] for n, k, _, _ in built}
    for _ in range(rounds):
        for n, k, a, _ in built:
            ref = ctypes.byref(a)
            for _ in range(3): fp.lib.smallem_pass(ref)
            t = []
            for _ in range(reps): t0 = time.perf_counter(); fp.lib.smallem_pass(ref); t.append(time.perf_counter() - t0)
            ts[n, k].append(statistics.median(t) * 1e6)
    cache.keep(s[0], context)
    return {f"{k} {n}": round(statistics.median(v), 1) for (n, k), v in ts.items()}

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--proposers', default='mtp,draft2'); p.add_argument('--chains', default='1,2,3')
    p.add_argument('--shapes', default='1,1x1,1x1x1,2,3,2x1,3x1,2x1x1,2x2x1,3x2x1,n8w2t2d4')
    p.add_argument('--prompts', type=int, default=8); p.add_argument('--new-tokens', type=int, default=200)
    p.add_argument('--repeats', type=int, default=3); p.add_argument('--json', default=None)
    p.add_argument('--temperatures', default='0,1', help="greedy rows (0) and sampled rows at these temperatures")
    a = p.parse_args(argv)
    t_start = time.time()
    target = FastSmallem(load_or_train('cpu', 'target', progress=False))
    if target.fused is None: sys.exit("tree_bench: the fused CPU kernel is not available here")
    props = a.proposers.split(',')
    models = {b: FastSmallem(load_or_train('cpu', b, progress=False)) for b in props if b != 'mtp'}
    prompts = validation_prompts('cpu', n=a.prompts, length=32)
    costs = pass_costs(target)
    print('kernel pass, µs (200 cached):', '  '.join(f"{k} {v:.0f}" for k, v in costs.items()), flush=True)
    Ts = [float(x) for x in a.temperatures.split(',')]
    rows = [(T, 'none', 'alone', None) for T in Ts] + [(T, pr, 'chain', int(k)) for T in Ts for pr in props for k in a.chains.split(',')] \
           + [(T, pr, 'tree', sh) for T in Ts for pr in props for sh in a.shapes.split(',')]
    plain = generate(target, prompts, a.new_tokens)
    runs = {r: [] for r in rows}; alone = {T: [] for T in Ts}; stats = {}
    for rep in range(a.repeats):
        for r in rows:
            T, pr, how, arg = r
            t0 = time.perf_counter(); outs = []
            for i, q in enumerate(prompts):
                g = torch.Generator().manual_seed(1000 * rep + i)
                if how == 'alone': outs += generate(target, [q], a.new_tokens, T, g)
                elif how == 'chain': outs += speculative_generate(target, make_proposer(pr, target, models), [q], a.new_tokens, arg, T, g)[0]
                else:
                    o, st = tree_generate(target, make_tree_proposer(pr, target, models), [q], a.new_tokens, arg, T, g); outs += o
                    stats.setdefault(r, []).append(st.tokens_per_round)
            dt = time.perf_counter() - t0
            if T == 0 and outs != plain: sys.exit(f"tree_bench: {r}: greedy text differs from the target alone")
            runs[r].append(a.prompts * a.new_tokens / dt)
            if how == 'alone': alone[T].append(runs[r][-1])
        print(f"repeat {rep + 1}/{a.repeats} done ({time.time() - t_start:.0f} s)", flush=True)
    out_rows = []
    for r in rows:
        T, pr, how, arg = r
        sp = statistics.median(x / y for x, y in zip(runs[r], alone[T]))
        row = {'temperature': T, 'proposer': pr, 'kind': how, 'k_or_shape': arg, 'tokens_per_s': round(statistics.median(runs[r]), 1), 'speedup': round(sp, 3),
               'identical': True if T == 0 else None}
        if r in stats: row['tokens_per_round'] = round(statistics.mean(stats[r]), 3)
        if how == 'tree': row['rounds'] = 'library' if _library_rounds(target, make_tree_proposer(pr, target, models), parse_shape(arg), T, None) is not None else 'python'
        out_rows.append(row)
        print(f"T={T:g} {pr:7s} {how:6s} {str(arg or ''):10s} {row['tokens_per_s']:8,.0f} tok/s  x{sp:.2f}" + (f"  {row['tokens_per_round']:.2f} tokens a round, rounds in {row['rounds']}" if 'tokens_per_round' in row else ''))
    res = {'meta': {'command': 'python tools/tree_bench.py ' + ' '.join(argv if argv is not None else sys.argv[1:]), 'cpu': F.cpu_info(),
                    'threads': torch.get_num_threads(), 'precision': target.precision, 'when': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
                    'prompts': a.prompts, 'new_tokens': a.new_tokens, 'repeats': a.repeats, 'temperatures': Ts, 'seconds': round(time.time() - t_start, 1)},
           'pass_us': costs, 'rows': out_rows}
    if a.json: Path(a.json).write_text(json.dumps(res, indent=1) + '\n'); print('wrote', a.json)

if __name__ == '__main__': main()
