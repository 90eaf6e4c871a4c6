"""The fused pass stage by stage on this machine (issue 55): `pass_stages` and `kernel_times` for int8 and fp32 panels at 2 and 1 threads, and the int8 / fp32 probes.

    python runs/issue55_zen3/stages.py runs/issue55_zen3/stages_cpu_amd-zen3.json | tee runs/issue55_zen3/stages_cpu_amd-zen3.txt
"""
import torch, sys, statistics, json
from smallem_spec.train import load_or_train
from smallem_spec.fast import FastSmallem, kernel_times
from smallem_spec import fused as F
out = {}
target = load_or_train('cpu', 'target', progress=False)
for th in (2, 1):
    torch.set_num_threads(th)
    for prec in ('int8', 'fp32'):
        f = FastSmallem(target, precision=prec)
        st = F.pass_stages(f, Ts=(1, 2, 4), reps=300)
        runs = [kernel_times(f, Ts=(1, 2, 4), reps=100) for _ in range(3)]
        kt = {T: statistics.median(r[T] for r in runs) * 1e6 for T in runs[0]}
        out[f'{prec}_{th}threads'] = {'stages_us': {T: {k: round(v, 1) for k, v in d.items()} for T, d in st.items()}, 'kernel_times_us': {T: round(v, 1) for T, v in kt.items()}}
        lines = [f"{prec}, {th} thread(s): kernel_times t(1) {kt[1]:.0f} µs, t(2) {kt[2]:.0f}, t(4) {kt[4]:.0f}; per extra row {(kt[4]-kt[1])/3:.0f} µs",
                 f"{'stage':20s}" + ''.join(f"{T:>9d}" for T in st) + '   per extra row (T=1 -> 4)']
        for s in list(F.PASS_STAGES) + ['pass']:
            lines.append(f"{s:20s}" + ''.join(f"{st[T][s]:9.1f}" for T in st) + f"{(st[4][s]-st[1][s])/3:12.1f}")
        print('\n'.join(lines), flush=True)
lib = F.load_kernel()
out['probes'] = {'int8_gops_1thread': round(max(lib.smallem_peak_int8(1, 2000000) for _ in range(3)), 1), 'fp32_gflops_1thread': round(max(lib.smallem_peak(1, 2000000) for _ in range(3)), 1),
                 'int8_gops_2threads': round(max(lib.smallem_peak_int8(2, 2000000) for _ in range(3)), 1), 'fp32_gflops_2threads': round(max(lib.smallem_peak(2, 2000000) for _ in range(3)), 1)}
out['cpu'] = F.cpu_info()
print(out['probes'])
json.dump(out, open(sys.argv[1], 'w'), indent=1)
