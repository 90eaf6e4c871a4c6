"""Resumable training: a tiny run interrupted half-way and resumed from its saved state ends with exactly the weights,
optimiser moments and curve of the same run uninterrupted; a state saved by another run is refused; the command
writes no model until its run is finished."""
import subprocess, sys
from dataclasses import replace
import pytest, torch
from smallem_spec.core import SmallemError
from smallem_spec.train import train_model, TRAIN_PRESETS

TC = replace(TRAIN_PRESETS['tiny'], steps=12, eval_every=4, eval_windows=2)

@pytest.mark.parametrize('dropout,ema', [(0.0, 0.0), (0.1, 0.0), (0.0, 0.9)])   # with dropout the masks come from torch's RNG: its state must resume too; the weights' average too
def test_resumed_run_equals_uninterrupted(tmp_path, dropout, ema):
    tc = replace(TC, dropout=dropout, ema=ema)
    whole, rec = train_model('tiny', 'target', tc, progress=False)
    st = tmp_path/'target.state.pt'
    none, part = train_model('tiny', 'target', tc, progress=False, state=st, until=6)       # stops after step 6 (between evaluations)
    assert none is None and part == {'preset': 'tiny', 'name': 'target', 'steps': 6, 'of': 12, 'finished': False} and st.exists()
    resumed, rec2 = train_model('tiny', 'target', tc, progress=False, state=st)
    a, b = whole.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run's"
    assert rec2['history'] == rec['history'] and rec2['val'] == rec['val'] and rec2['steps'] == 12

def test_early_stop_resumes_with_its_best_weights(tmp_path):
    "`patience`: a run that stops on validation returns its best evaluation's weights; interrupted after that evaluation and"
    " resumed, it stops at the same step with the same weights (the best ones travel in the saved state), not the last ones."
    from smallem_spec.corpus import load_tokens, TokenData
    tiny = load_tokens('tiny'); n = 2_000   # 2,000 training tokens: learned by heart, so validation turns up within a few evaluations
    few = TokenData(tiny.train[:n], tiny.val, round(tiny.train_bytes * n / len(tiny.train)), tiny.val_bytes, tiny.tok_hash)
    tc = replace(TRAIN_PRESETS['tiny'], steps=400, eval_every=10, eval_windows=4, patience=3, lr=1e-2)
    whole, rec = train_model('tiny', 'draft2', tc, progress=False, data=few)
    es = rec['early_stop']
    assert es['kept_step'] < es['stopped_at'] < tc.steps, es
    st = tmp_path/'draft2.state.pt'
    assert train_model('tiny', 'draft2', tc, progress=False, data=few, state=st, until=es['kept_step'] + 5)[0] is None
    resumed, rec2 = train_model('tiny', 'draft2', tc, progress=False, data=few, state=st)
    a, b = whole.state_dict(), resumed.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run kept other weights"
    assert rec2['early_stop'] == es and rec2['history'] == rec['history']

def test_moving_average_of_the_weights(tmp_path):
    "`ema`: the saved model is the average of the weights after each step, as computed by hand from the run's own steps"
    " (each step saved by resuming one step at a time), with its decay's ramp; training itself is unchanged (the record"
    " keeps the trained weights' score, equal to the same run without the average), and the average is not those weights."
    d = 0.5; tc = replace(TC, ema=d)   # the ramp s / (9 + s) reaches the decay at step 9 of 12
    avg_model, rec = train_model('tiny', 'target', tc, progress=False)
    plain, prec = train_model('tiny', 'target', TC, progress=False)
    assert rec['val_trained_weights'] == prec['val'] and rec['val'] != prec['val']
    assert all('ema_val_nats_per_byte' in h for h in rec['history']) and [h['val_nats_per_byte'] for h in rec['history']] == [h['val_nats_per_byte'] for h in prec['history']]
    from smallem_spec.model import Smallem, model_config
    torch.manual_seed(TC.seed); hand = {n: p.detach().clone() for n, p in Smallem(model_config('tiny', 'target')).named_parameters()}   # the run's start
    st = tmp_path/'target.state.pt'
    for s in range(1, TC.steps + 1):   # the plain run, one step at a time: its weights after each step, averaged by hand
        if s < TC.steps: train_model('tiny', 'target', TC, progress=False, state=st, until=s); w = torch.load(st, weights_only=False)['model']
        else: w = plain.state_dict()
        hand = {n: torch.lerp(hand[n], w[n].float(), 1 - min(d, s / (9 + s))) for n in hand}
    got = dict(avg_model.named_parameters())
    assert all((got[n].detach() - hand[n]).abs().max() < 1e-5 for n in hand)
    assert not all(torch.equal(got[n], p) for n, p in plain.named_parameters())

def test_interruption_is_not_a_no_op(tmp_path):
    "The control: without its optimiser state, the same interruption gives other weights (so equality above is not trivial)."
    st = tmp_path/'target.state.pt'
    train_model('tiny', 'target', TC, progress=False, state=st, until=6)
    s = torch.load(st, weights_only=False); s['opt']['state'] = {}; torch.save(s, st)   # the optimiser's moments forgotten
    whole, _ = train_model('tiny', 'target', TC, progress=False)
    resumed, _ = train_model('tiny', 'target', TC, progress=False, state=st)
    assert not all(torch.equal(x, y) for x, y in zip(whole.state_dict().values(), resumed.state_dict().values()))

def test_state_of_another_run_is_refused(tmp_path):
    st = tmp_path/'target.state.pt'
    train_model('tiny', 'target', TC, progress=False, state=st, until=2)
    with pytest.raises(SmallemError, match='another run'): train_model('tiny', 'draft2', TC, progress=False, state=st)
    with pytest.raises(SmallemError, match='another run'): train_model('tiny', 'target', replace(TC, steps=20), progress=False, state=st)

def test_command_writes_the_model_only_when_finished(tmp_path):
    cmd = [sys.executable, '-c', 'from smallem_spec.train import train_cli; train_cli()', '--preset', 'tiny', '--name', 'draft2',
           '--steps', '4000', '--minutes', '0.002', '--resume', '--out', str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0 and 'stopped after step' in r.stdout, r.stdout + r.stderr
    assert (tmp_path/'draft2.state.pt').exists() and not (tmp_path/'draft2.safetensors').exists()

def test_dropout_only_while_training():
    "Residual dropout changes the training passes (two passes differ) and never an inference pass (equal to the model without it)."
    from smallem_spec.model import Smallem, model_config
    torch.manual_seed(0); m = Smallem(model_config('tiny', 'target'))
    x = torch.randint(0, 512, (2, 16))
    m.eval(); ref = m(x)
    m.set_dropout(0.2).train()
    assert not torch.equal(m(x), m(x)), "dropout 0.2 left the training pass deterministic"
    m.eval(); assert torch.equal(m(x), ref), "dropout changed an inference pass"
    assert all(b.drop == 0.2 for b in [*m.layers, m.mtp.block])

def test_a_candidate_of_another_depth(tmp_path):
    "`--layers`: a model of another depth than the preset's, its depth in the manifest and the command; a saved run of another"
    " depth is refused on resuming; the preset's loader refuses the checkpoint until the preset has that depth."
    from smallem_spec.train import load_checkpoint
    cmd = [sys.executable, '-c', 'from smallem_spec.train import train_cli; train_cli()', '--preset', 'tiny', '--name', 'target',
           '--steps', '2', '--layers', '3', '--out', str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True); assert r.returncode == 0, r.stdout + r.stderr
    import json; man = json.loads((tmp_path/'target.json').read_text())
    assert man['config']['n_layers'] == 3 and ' --layers 3 ' in man['command']
    with pytest.raises(SmallemError, match='another configuration'): load_checkpoint(tmp_path, 'target', 'tiny')
    st = tmp_path/'t.state.pt'
    train_model('tiny', 'target', TC, progress=False, state=st, until=2, layers=3)
    with pytest.raises(SmallemError, match='another run'): train_model('tiny', 'target', TC, progress=False, state=st)

def test_a_wider_candidate(tmp_path):
    "`--dim`/`--ffn-dim`: a model of another width (heads of the preset's size) and feed-forward size, both in the manifest"
    " and the command; a saved run of another width is refused on resuming; the preset's loader refuses the checkpoint."
    from smallem_spec.train import load_checkpoint
    cmd = [sys.executable, '-c', 'from smallem_spec.train import train_cli; train_cli()', '--preset', 'tiny', '--name', 'target',
           '--steps', '2', '--dim', '96', '--ffn-dim', '160', '--out', str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True); assert r.returncode == 0, r.stdout + r.stderr
    import json; man = json.loads((tmp_path/'target.json').read_text())
    assert (man['config']['dim'], man['config']['n_heads'], man['config']['ffn_dim']) == (96, 3, 160), man['config']
    assert ' --dim 96 --ffn-dim 160 ' in man['command']
    with pytest.raises(SmallemError, match='another configuration'): load_checkpoint(tmp_path, 'target', 'tiny')
    with pytest.raises(SmallemError, match='not a multiple'): train_model('tiny', 'target', TC, progress=False, dim=100)
    st = tmp_path/'t.state.pt'
    train_model('tiny', 'target', TC, progress=False, state=st, until=2, dim=96)
    with pytest.raises(SmallemError, match='another run'): train_model('tiny', 'target', TC, progress=False, state=st)
