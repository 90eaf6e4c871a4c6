"""What eight bits cost the family: nats/byte of each committed model on the whole validation split, fp32 and int8
panels (`FastSmallem(precision='int8')`), and the MTP module's loss, top-1 accuracy and agreement with its own target.
Counts, not timings; the same on every machine whose int8 product has the same levels of x (127 with VNNI or portable C,
63 on plain AVX2: `int8_levels`). `python tools/int8_quality.py [--preset cpu] [--json nbs/bench/int8_quality_cpu.json]`"""
import argparse, json, time
from tqdm.auto import tqdm
import torch
from smallem_spec.corpus import load_tokens
from smallem_spec.fast import FastSmallem
from smallem_spec.fused import cpu_info, int8_kind, int8_levels
from smallem_spec.train import load_or_train, evaluate

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--preset', default='cpu'); p.add_argument('--models', default='target,draft2,draft4,draft2_kd,draft4_kd')
    p.add_argument('--json', default=None)
    a = p.parse_args(argv)
    data, t0, rows = load_tokens(a.preset), time.time(), {}
    names = a.models.split(',')
    with torch.inference_mode():
        for name in tqdm(names, desc='models'):
            m = load_or_train(a.preset, name, progress=False)
            r = {prec: evaluate(FastSmallem(m, precision=prec), data) for prec in ('fp32', 'int8')}
            rows[name] = {prec: {k: round(v, 5) if isinstance(v, float) else v for k, v in d.items()} for prec, d in r.items()}
            rows[name]['int8_minus_fp32_nats_per_byte'] = round(r['int8']['nats_per_byte'] - r['fp32']['nats_per_byte'], 5)
            print(f"{name:10s} fp32 {r['fp32']['nats_per_byte']:.4f}  int8 {r['int8']['nats_per_byte']:.4f}  (+{rows[name]['int8_minus_fp32_nats_per_byte']:.4f} nats/byte)"
                  + (f"; MTP top-1 {r['fp32']['mtp_acc']:.3f} -> {r['int8']['mtp_acc']:.3f}, agreement {r['fp32']['mtp_agree']:.3f} -> {r['int8']['mtp_agree']:.3f}" if 'mtp_acc' in r['fp32'] else ''))
    res = {'meta': {'command': 'python tools/int8_quality.py ' + ' '.join(argv if argv is not None else __import__('sys').argv[1:]), 'preset': a.preset,
                    'cpu': cpu_info(), 'int8_product': int8_kind(), 'x_levels': int8_levels(), 'windows': rows[names[0]]['fp32']['windows'], 'seconds': round(time.time() - t0, 1)}, 'models': rows}
    if a.json:
        with open(a.json, 'w') as f: json.dump(res, f, indent=1)
        print('wrote', a.json)

if __name__ == '__main__': main()
