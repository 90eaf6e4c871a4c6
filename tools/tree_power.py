"""How often the end-to-end law test of tests/test_trees.py rejects the tree rule and its two planted bugs, over seeds.

    python tools/tree_power.py [--prompt 44] [--seeds 8] [--null-seeds 4] [--n 4000] [--shape 4x2x1] [--path reference] [--out nbs/bench/tree_e2e_power.json]
    python tools/tree_power.py --path library --out nbs/bench/tree_e2e_power_library.json

Each run: N sampled continuations (T = 1, 3 tokens) of validation prompt PROMPT (of `validation_prompts('cpu', 64)`) with the MTP module's trees of SHAPE,
tokens 1-3 against the target's exact law (`law_test`, chi-squared at 0.1% each): rejected when any of the three
positions is. 'exact' is the rule (its rejections are false failures, at most 0.3% a run); 'unchanged' tries every
sibling against p itself; 'keep' draws the correction with the refused siblings left in. Counts, not timings.
The first token comes from the target's prefill, not from a tree, so the rule shows from the second token on; prompt 44
is where the module's guesses after the likeliest first tokens hold the most of the target's mass (`--pick` ranks the
64 prompts by the planted bug's chi-squared noncentrality at the second token, the module's guesses taken without the
prompt's context, so an approximation), which is where a wrong sibling rule shows most. `--path`: the reference model
(rounds from Python), or the fused kernel (fp32 panels) with the rounds in its library (`library`) or from Python (`python`).
"""
import argparse, json, os, time
from pathlib import Path
import torch
from smallem_spec.train import load_or_train
from smallem_spec.corpus import validation_prompts
from smallem_spec.exactness import law_test
from smallem_spec.fused import cpu_info
from smallem_spec.tree import TreeMTP, tree_generate

def run(t, prompt, rule, N, shape, seed, chunk=250):
    g, outs = torch.Generator().manual_seed(seed), []
    for _ in range(N // chunk): outs += tree_generate(t, TreeMTP(t), [prompt] * chunk, 3, shape, 1.0, g, _rule=rule)[0]
    res = [law_test(t, [prompt] * N, outs, 1.0, j) for j in (1, 2, 3)]
    return [dict(position=r['position'], stat=round(r['stat'], 2), threshold=round(r['threshold'], 2), df=r['df']) for r in res]

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--seeds', type=int, default=8); ap.add_argument('--null-seeds', type=int, default=4)
    ap.add_argument("--n", type=int, default=4000); ap.add_argument('--shape', default='4x2x1')
    ap.add_argument('--out', default='nbs/bench/tree_e2e_power.json'); ap.add_argument('--prompt', type=int, default=44)
    ap.add_argument('--only', default='exact,unchanged,keep'); ap.add_argument('--path', default='reference', choices=['reference', 'library', 'python'])
    a = ap.parse_args(argv); t0 = time.time()
    t = load_or_train('cpu', 'target', progress=False); prompt = validation_prompts('cpu', 64)[a.prompt]
    if a.path != 'reference':
        from smallem_spec.fast import FastSmallem
        from smallem_spec.tree import _library_rounds, parse_shape
        os.environ['SMALLEM_ROUNDS'] = 'fused' if a.path == 'library' else 'python'
        t = FastSmallem(t, precision='fp32')
        if (_library_rounds(t, TreeMTP(t), parse_shape(a.shape), 1.0, None) is not None) != (a.path == 'library'): raise SystemExit(f"tree_power: the rounds would not run on the {a.path} path here")
    rows = []
    for rule, seeds in (('exact', a.null_seeds), ('unchanged', a.seeds), ('keep', a.null_seeds)):
        if rule not in a.only.split(','): continue
        for s in range(seeds):
            pos = run(t, prompt, rule, a.n, a.shape, 1000 + s)
            rows.append(dict(rule=rule, seed=1000 + s, rejected=any(p['stat'] >= p['threshold'] for p in pos), positions=pos))
            print(rule, 1000 + s, 'rejected' if rows[-1]['rejected'] else 'passed', [(p['position'], p['stat'], p['threshold']) for p in pos], flush=True)
    meta = dict(prompt=a.prompt, path=a.path, command='python tools/tree_power.py ' + ' '.join(argv or __import__('sys').argv[1:]), N=a.n, shape=a.shape, temperature=1.0,
                proposer='mtp', cpu_kind=cpu_info()['kind'], when=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), seconds=round(time.time() - t0))
    Path(a.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + '\n'); print('written', a.out)

if __name__ == '__main__': main()
