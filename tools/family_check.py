"""Acceptance at position 1 of every proposer against a family's target: k = 1, batch 1, greedy and T = 1.

    python tools/family_check.py [--dir models/cpu] [--prompts 8] [--new-tokens 200] [--out nbs/bench/family_cpu.json]

The benchmark's prompts (8 validation prompts of 32 tokens) and length (200 new tokens), one prompt at a time, for the
target's MTP module, draft2, draft4 and the distilled draft2_kd, draft4_kd loaded from DIR, plus each model's whole-split
validation nats/byte from its manifest. Counts, not timings: the figures do not depend on how busy the machine is.
"""
import argparse, json, time
from pathlib import Path
import torch
from smallem_spec.fused import cpu_info
from smallem_spec.corpus import validation_prompts
from smallem_spec.train import load_checkpoint
from smallem_spec.spec import speculative_generate, DraftProposer
from smallem_spec.mtp import MTPProposer

def first_guess(target, make, prompts, n, temperature, seed=0):
    acc = prop = 0
    for i, p in enumerate(prompts):
        g = torch.Generator().manual_seed(seed + i)
        _, st = speculative_generate(target, make(), [p], n, 1, temperature=temperature, generator=g)
        acc += st.pos_accepted[0]; prop += st.pos_proposed[0]
    return acc / prop

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--dir', default='models/cpu'); ap.add_argument('--prompts', type=int, default=8)
    ap.add_argument('--new-tokens', type=int, default=200); ap.add_argument('--out', default=None)
    a = ap.parse_args(argv); d = Path(a.dir); t0 = time.time()
    target = load_checkpoint(d, 'target', 'cpu').eval()
    prompts = validation_prompts('cpu', a.prompts)
    val = {n: json.loads((d/f'{n}.json').read_text())['val']['nats_per_byte'] for n in
           ('target', 'target_nomtp', 'draft2', 'draft4', 'draft2_kd', 'draft4_kd') if (d/f'{n}.json').exists()}
    props = {'mtp': lambda: MTPProposer(target)}
    for n in ('draft2', 'draft4', 'draft2_kd', 'draft4_kd'):
        if (d/f'{n}.json').exists():
            m = load_checkpoint(d, n, 'cpu').eval(); props[n] = (lambda m=m: DraftProposer(m))
    res = {'meta': {'command': 'python tools/family_check.py ' + ' '.join(argv or __import__('sys').argv[1:]), 'dir': str(d),
                    'cpu': cpu_info()['model'], 'cpu_kind': cpu_info()['kind'],
                    'when': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'prompts': a.prompts, 'new_tokens': a.new_tokens,
                    'target_sha256': json.loads((d/'target.json').read_text())['weights_sha256']},
           'val_nats_per_byte': val, 'gaps': {n: round(v - val['target'], 4) for n, v in val.items() if n != 'target'},
           'first_guess_kept': {}}
    for name, make in props.items():
        res['first_guess_kept'][name] = {T: round(first_guess(target, make, prompts, a.new_tokens, float(T)), 4) for T in ('0', '1')}
        print(f"{name:10s} first guess kept: greedy {res['first_guess_kept'][name]['0']:.3f}, T=1 {res['first_guess_kept'][name]['1']:.3f}", flush=True)
    for n, g in res['gaps'].items(): print(f"{n:12s} {val[n]:.4f} nats/byte, {g:+.4f} against the target ({val['target']:.4f})")
    res['meta']['seconds'] = round(time.time() - t0, 1)
    if a.out: Path(a.out).write_text(json.dumps(res, indent=1) + '\n'); print('written', a.out)

if __name__ == '__main__': main()
