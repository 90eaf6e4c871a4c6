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
