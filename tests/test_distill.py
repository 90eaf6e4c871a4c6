"""Distilled drafters (03_train): a `_kd` model is trained on KL(p_target || q) and records its teacher. Deterministic
(seeded training on the tiny preset); what each test would catch is in its docstring."""
from dataclasses import replace
import numpy as np, pytest, torch
from smallem_spec.train import train_model, TRAIN_PRESETS, load_or_train, distill_losses
from smallem_spec.corpus import load_tokens

@pytest.fixture(scope='module')
def tiny_pair():
    data = load_tokens('tiny'); teacher = load_or_train('tiny', 'target', progress=False)
    tc = replace(TRAIN_PRESETS['tiny'], steps=60)
    plain, _ = train_model('tiny', 'draft2', tc, progress=False, data=data)
    kd, rec = train_model('tiny', 'draft2_kd', tc, progress=False, data=data)
    v = torch.from_numpy(data.val[:64 * 129].astype(np.int64)).view(64, 129)
    return teacher, plain.eval(), kd.eval(), rec, v

def test_kl_is_zero_against_itself_and_positive_otherwise(tiny_pair):
    "A KL with its arguments swapped or a log-probability taken twice would not vanish on identical laws."
    teacher, plain, _, _, v = tiny_pair
    with torch.no_grad():
        assert float(distill_losses(teacher, teacher, v)[1]) < 1e-5
        assert float(distill_losses(plain, teacher, v)[1]) > 0.01

def test_distilled_drafter_is_closer_to_its_teacher(tiny_pair):
    "Same steps, same data, same seed: the drafter trained on the target's law is much closer to it (KL on validation)"
    "than the one trained on the text, and agrees with its greedy choice at least as often. A run that ignored the"
    "teacher (trained on the text) would fail the first; the committed cpu pair is compared in 07_drafters."
    teacher, plain, kd, rec, v = tiny_pair
    with torch.no_grad():
        kl_plain, kl_kd = float(distill_losses(plain, teacher, v)[1]), float(distill_losses(kd, teacher, v)[1])
        top = teacher(v[:, :-1]).argmax(-1)
        agree = {n: float((m(v[:, :-1]).argmax(-1) == top).float().mean()) for n, m in (('plain', plain), ('kd', kd))}
    assert kl_kd < 0.5 * kl_plain, (kl_kd, kl_plain)
    assert agree['kd'] >= agree['plain'], agree
    assert rec['teacher']['weights_sha256'] == teacher.manifest['weights_sha256']   # the manifest names its teacher

def test_cli_distills_toward_the_target_beside_it(tmp_path):
    "`smallem_train --out DIR` that already holds a target distils toward that one, not the committed or cached target"
    "(a family trained into a new folder would otherwise pair its drafters with another family's target)."
    import json, subprocess, sys
    run = lambda *a: subprocess.run([sys.executable, '-c', 'from smallem_spec.train import train_cli; import sys; train_cli(sys.argv[1:])', *a],
                                    capture_output=True, text=True)
    for n in ('target', 'draft2_kd'):
        r = run('--preset', 'tiny', '--name', n, '--steps', '2', '--out', str(tmp_path)); assert r.returncode == 0, r.stderr[-1500:]
    want = json.loads((tmp_path/'target.json').read_text())['weights_sha256']
    assert json.loads((tmp_path/'draft2_kd.json').read_text())['teacher']['weights_sha256'] == want

def test_mtp_stage_brings_the_module_toward_the_target_and_leaves_the_rest(tiny_pair):
    "`distill_mtp` trains the MTP module alone toward the target's own law of token i+2 (read at position i+1): its KL"
    "to that law falls on validation, and every other weight is left bit for bit. A stage that read p one position off"
    "(position i: the law of token i+1) would not lower this KL; one that let the trunk train would change its weights."
    import copy
    from smallem_spec.train import distill_mtp, mtp_distill_losses
    teacher, _, _, _, v = tiny_pair
    m = copy.deepcopy(teacher); rest = {k: t.clone() for k, t in m.state_dict().items() if not k.startswith('mtp.')}
    with torch.no_grad(): before = float(mtp_distill_losses(m.eval(), v)[1])
    st = distill_mtp(m, load_tokens('tiny'), steps=40, lr=3e-3, batch_size=8, seq_len=128, progress=False)
    with torch.no_grad(): after = float(mtp_distill_losses(m.eval(), v)[1])
    assert after < 0.7 * before, (before, after)
    assert all(torch.equal(t, m.state_dict()[k]) for k, t in rest.items()), "the MTP stage changed weights outside the module"
    assert st['after']['nats_per_byte'] == st['before']['nats_per_byte'] and st['steps'] == 40

def test_cli_mtp_stage(tmp_path):
    "`smallem_train --name target --mtp-distill N` rewrites the target beside it: module trained, trunk the same bits,"
    "manifest with both commands and the stage's record; with another --name, one line and exit 2."
    import json, subprocess, sys
    from safetensors.torch import load_file
    run = lambda *a: subprocess.run([sys.executable, '-c', 'from smallem_spec.train import train_cli; import sys; train_cli(sys.argv[1:])', *a],
                                    capture_output=True, text=True)
    r = run('--preset', 'tiny', '--name', 'target', '--steps', '4', '--out', str(tmp_path)); assert r.returncode == 0, r.stderr[-1500:]
    w0 = load_file(str(tmp_path/'target.safetensors'))
    r = run('--preset', 'tiny', '--name', 'target', '--mtp-distill', '3', '--out', str(tmp_path)); assert r.returncode == 0, r.stderr[-1500:]
    w1 = load_file(str(tmp_path/'target.safetensors')); man = json.loads((tmp_path/'target.json').read_text())
    assert all(torch.equal(w0[k], w1[k]) for k in w0 if not k.startswith('mtp.')) and any(not torch.equal(w0[k], w1[k]) for k in w0 if k.startswith('mtp.'))
    assert '--steps 4' in man['command'] and man['command'].endswith(f'--mtp-distill 3 --out {tmp_path}') and man['mtp_distill']['steps'] == 3
    r = run('--preset', 'tiny', '--name', 'draft2', '--mtp-distill', '3', '--out', str(tmp_path))
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'use it with --name target' in r.stderr, r.stderr
