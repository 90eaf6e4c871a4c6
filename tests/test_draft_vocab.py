"""Draft vocabularies (12b_draft_vocab): the fused kernel's restricted head equals the reference proposer with the other
logits masked (tokens and q), q is zero outside the vocabulary, greedy text is the target's, the sampled text keeps the
target's law end to end, and bad vocabularies or proposer names give one-line errors.
Statistics: two end-to-end tests of 2 chi-squared tests at 0.1% each (tokens 2 and 3): at most 0.2% per test, 0.4% for the file."""
import json, hashlib
import pytest, torch
from smallem_spec.core import SmallemError, repo_models_dir
from smallem_spec.corpus import draft_vocab, token_ranking, load_tokens
from smallem_spec.fast import FastSmallem
from smallem_spec.fused import load_kernel
from smallem_spec.generate import generate
from smallem_spec.spec import DraftProposer, speculative_generate
from smallem_spec.mtp import MTPProposer
from smallem_spec.exactness import e2e_test
from smallem_spec.mtp import parse_proposer, make_proposer

@pytest.fixture(scope='module')
def fast(cpu_models):
    return {n: FastSmallem(m) for n, m in cpu_models.items()}

def test_ranking_is_the_training_splits_and_recorded_in_the_manifests():
    "The committed ranking is the training split's token counts, most frequent first; every manifest names its hash."
    f = repo_models_dir()/'cpu'/'token_ranking.json'
    rec = json.loads(f.read_text()); r = torch.tensor(rec['ranking'])
    counts = torch.bincount(torch.from_numpy(load_tokens('cpu').train.astype('int64')), minlength=len(r))
    assert torch.equal(counts[r], torch.tensor(rec['counts'])) and (counts[r].diff() <= 0).all()
    assert torch.equal(torch.from_numpy(token_ranking('cpu')), r)
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    for name in ('target', 'draft2', 'draft4', 'target_nomtp'):
        assert json.loads((repo_models_dir()/'cpu'/f'{name}.json').read_text())['token_ranking_sha256'] == sha, name

@pytest.mark.skipif(load_kernel() is None, reason="no C compiler: the fused kernel cannot be built here")
@pytest.mark.parametrize('who', ['mtp', 'draft2'])
@pytest.mark.parametrize('T', [0.0, 1.0])
def test_restricted_head_equals_masked_logits(cpu_models, fast, prompts, who, T):
    "One round's guesses with the fused restricted head == the reference model's with logits off the vocabulary masked; q is 0 off it."
    v = draft_vocab('cpu', 512)
    mk = {'mtp': lambda m: MTPProposer(m, vocab=v), 'draft2': lambda m: DraftProposer(m, vocab=v)}[who]
    outs = []
    exact = {n: FastSmallem(cpu_models[n], proposer_bf16=False) for n in ('target', 'draft2')}   # proposing passes that compute the model to float rounding
    for m in ((exact['target'], cpu_models['target']) if who == 'mtp' else (exact['draft2'], cpu_models['draft2'])):
        tgt = m if who == 'mtp' else cpu_models['target']
        with torch.inference_mode():
            p = mk(m); c = tgt.new_cache(capacity=[64]); s = [c.new_seq()]
            lg, h = tgt(torch.tensor([prompts[0][:20]]), c, s, return_hidden=True)
            p.start([prompts[0][:20]], lg[:, -1].argmax(-1).tolist(), h, [64])
            outs.append(p.propose([0], [4], T, torch.Generator().manual_seed(5)))   # one row: both paths read the uniforms in the same order
    (d1, q1), (d2, q2) = outs
    assert torch.equal(d1, d2), (d1, d2)
    assert all(t in set(v.tolist()) for t in d1.flatten().tolist())
    if T > 0:
        off = torch.ones(q1.shape[-1], dtype=torch.bool); off[v] = False
        assert (q1[..., off] == 0).all() and torch.allclose(q1, q2, atol=1e-5)

def test_greedy_identity_with_a_draft_vocabulary(fast, prompts):
    t = fast['target']; plain = generate(t, prompts[:4], 80)
    for name in ('mtp_v256', 'draft2_v1024', 'draft4_v512', 'mtp_v100'):   # 100: not a multiple of 32, the masked path
        assert speculative_generate(t, make_proposer(name, t, {'draft2': fast['draft2'], 'draft4': fast['draft4']}, 'cpu'), prompts[:4], 80, 3)[0] == plain, name

def test_end_to_end_mtp_with_a_draft_vocabulary(fast, prompts):
    "Tokens 2-3 of 4000 continuations by MTP restricted to 256 tokens (fast path) against the exact law: chi-squared at 0.1% on each of two positions (false-failure rate at most 0.2%); the accept-everything control rejected (at 2,000 draws)."
    t = fast['target']; v = draft_vocab('cpu', 256)
    r = e2e_test(t, lambda: MTPProposer(t, vocab=v), prompts[0], 4000, seed=4)
    assert r['stat'] < r['threshold'], f"speculative vs the exact law: chi2 {r['stat']:.1f} >= {r['threshold']:.1f} (false-failure rate at most 0.2%)"
    r = e2e_test(t, lambda: MTPProposer(t, vocab=v), prompts[0], 2000, seed=4, mode='accept')   # half the draws suffice: chi2 4.7x its threshold
    assert r['stat'] > r['threshold'], "negative control (every proposal accepted, 2,000 draws) not rejected"

def test_bad_vocabularies_and_names(fast):
    t = fast['target']
    for bad, msg in [(torch.tensor([5, 3]), 'increasing'), (torch.tensor([1, 4096]), r'\[0, 4096\)'), (torch.tensor([]), 'increasing'),
                     (torch.tensor([[1, 2]]), 'increasing'), (torch.tensor([0.5, 1.5]), 'increasing')]:
        with pytest.raises(SmallemError, match=msg): MTPProposer(t, vocab=bad)
    with pytest.raises(SmallemError, match='draft vocabulary size'): draft_vocab('cpu', 5000)
    with pytest.raises(SmallemError, match='increasing'): MTPProposer(t, vocab='x')
    with pytest.raises(SmallemError, match='draft vocabulary size'): make_proposer('mtp_v5000', t, {}, 'cpu')
    for name in ('mtp_v', 'ngram_v64', 'draft3', 'mtp_vx', 'mtp_v0'):
        with pytest.raises(SmallemError, match='unknown proposer'): parse_proposer(name)
    assert parse_proposer('mtp_v1024') == ('mtp', 1024) and parse_proposer('draft2') == ('draft2', None)

def test_end_to_end_draft2_with_a_draft_vocabulary(fast, prompts):
    "The same test for draft2 restricted to 1,024 tokens (false-failure rate at most 0.2%), with the control of every"
    "proposal accepted (the other control, plain draft2's own law against the target's, is test_verify.py's, on the"
    "reference code, whose draft2 gives the same texts)."
    t = fast['target']; mk = lambda: make_proposer('draft2_v1024', t, {'draft2': fast['draft2']}, 'cpu')
    r = e2e_test(t, mk, prompts[0], 4000, seed=5)
    assert r['stat'] < r['threshold'], f"speculative vs the exact law: chi2 {r['stat']:.1f} >= {r['threshold']:.1f} (false-failure rate at most 0.2%)"
    r = e2e_test(t, mk, prompts[0], 2000, seed=5, mode='accept')   # half the draws suffice: chi2 2.5x its threshold
    assert r['stat'] > r['threshold'], "negative control (every proposal accepted, 2,000 draws) not rejected"
