"""Chi-squared tests of speculative sampling, each with its negative control.
Every chi-squared test rejects at the 0.1% level. With fixed seeds the file is deterministic; over fresh seeds (or after a
change to the order of the draws) a correct sampler fails some test of this file with probability at most 3.3% (union
bound; 1 - 0.999^33 = 3.25% if they were independent), for it runs 33 of them: the pair test (1), four per-position
cases of 3 positions each (12), the end-to-end test's tokens 2 and 3 (2), and tokens 2 and 3 for each of nine more
end-to-end cases (18). The negative controls are not counted: they must reject."""
import pytest, torch
from smallem_spec.verify import pair_test, position_test, verify_sampled
from smallem_spec.exactness import e2e_test, lookup_shift, bias_shift
from smallem_spec.spec import DraftProposer
from smallem_spec.fast import FastSmallem
from smallem_spec.mtp import make_proposer
from smallem_spec.core import SmallemError

def test_pairs_article():
    r = pair_test(200_000, k=2, seed=1)
    assert round(r['threshold'], 1) == 51.2 and r['df'] == 24
    assert r['stat'] < r['threshold'], f"chi2 {r['stat']:.1f} >= {r['threshold']:.1f}: not the target's law (false-failure rate 0.1%: one test)"
    assert r['control_stat'] > 1000, f"negative control (same draws vs q) only {r['control_stat']:.1f}: the test has no power"

@pytest.mark.parametrize('kw', [dict(), dict(adversarial=True, scale=3.0), dict(k=1, temperature=1.3), dict(k=5, V=12)])
def test_positions(kw):
    "3 positions per case, each a chi-squared test at 0.1%: at most 0.3% per case, 1.2% for the 4 cases."
    # seed 3: with seed 2 the first case was rejected once (chi2 74.9 >= 72.1, p = 0.0005) after a CPU draw became the
    # inverse CDF (smallem_spec.generate.sample_probs); 90 other per-position tests (seeds 10-39) gave uniform p-values
    # (KS p = 0.22, smallest 0.019), and 40 direct tests of the sampler likewise: a rare draw, not a bias.
    res = position_test(60_000, seed=3, **kw)
    for r in res:
        assert r['stat'] < r['threshold'], f"position {r['position']}: chi2 {r['stat']:.1f} >= {r['threshold']:.1f} (false-failure rate at most 0.3% for this case's 3 tests, 1.2% for the 4 cases)"

def test_positions_negative_control():
    res = position_test(60_000, seed=2, residual=False)
    assert any(r['stat'] > r['threshold'] for r in res), "the planted bias (correction drawn from p) was not rejected"

def test_degenerate_cases():
    V, g = 8, torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(16, 4, V, generator=g), -1); d = torch.randint(0, V, (16, 3), generator=g)
    toks, n = verify_sampled(p, p[:, :3].clone(), d, g)           # p == q: everything accepted, bonus drawn
    assert (n == 3).all() and (toks >= 0).all()
    q = p[:, :3].clone(); q[:, 0] = 0; q[torch.arange(16), 0, d[:, 0]] = 1.   # q certain of a token: residual may be p - q
    toks, n = verify_sampled(p, q, d, g)
    assert not torch.isnan(toks.float()).any() and (toks[torch.arange(16), n] >= 0).all()
    for bad, msg in [(p * float('inf'), 'NaN or inf'), (p * 0.5, 'sum to 1'), (-p, 'negative')]:
        with pytest.raises(SmallemError, match=msg): verify_sampled(bad, p[:, :3], d)
    with pytest.raises(SmallemError, match='does not match'): verify_sampled(p, p[:, :2], d)

def test_end_to_end_draft2(cpu_models, prompts):
    t, d2 = cpu_models['target'], cpu_models['draft2']
    r = e2e_test(t, lambda: DraftProposer(d2), prompts[0], 4000, seed=3)
    assert r['stat'] < r['threshold'], f"speculative vs the exact law: chi2 {r['stat']:.1f} >= {r['threshold']:.1f} (false-failure rate at most 0.2%: tokens 2 and 3, each at 0.1%)"
    r = e2e_test(t, lambda: DraftProposer(d2), prompts[0], 2000, seed=3, mode='draft')   # half the draws suffice: chi2 2.4x its threshold
    assert r['stat'] > r['threshold'], "negative control (plain draft2 against the target's law, 2,000 draws) not rejected"
    r = e2e_test(t, lambda: DraftProposer(d2), prompts[0], 2000, seed=3, mode='accept')   # 08a's other control: chi2 2.1x its threshold (1.2x at 1,000)
    assert r['stat'] > r['threshold'], "negative control (every proposal accepted, 2,000 draws) not rejected"

@pytest.fixture(scope='module')
def fast(cpu_models):
    return {n: FastSmallem(m) for n, m in cpu_models.items()}

@pytest.mark.parametrize('name', ['draft2', 'draft4', 'mtp', 'ngram', 'draft2_kd', 'draft4_kd'])
def test_end_to_end_distinct_prompts(fast, prompts, name):
    """Every proposer on the fast path, batches of 250 rows over 8 distinct prompts, 4,000 continuations: tokens 2 and 3
    against the target's exact law given each row's own context (2 tests at 0.1%). The CI twin of the slow end-to-end
    cells of 07_drafters (draft4, ngram), 08_mtp (mtp) and 12_fast_path (draft2), with distinct prompts in a batch.
    At 4,000 rows spread over 8 prompts the planted bias is not caught in every seed, so it is not asserted here; its
    rejection rate at 16,000 rows is measured, per proposer, in 08a_exactness (`e2e_power`, nbs/bench/e2e_power.json)."""
    r = e2e_test(fast['target'], lambda: make_proposer(name, fast['target'], fast), prompts[0], 4000, seed=7, chunk=250, prompts=prompts)
    assert r['stat'] < r['threshold'], f"{name}: chi2 {r['stat']:.1f} >= {r['threshold']:.1f} (false-failure rate at most 0.2%)"

@pytest.mark.parametrize('name', ['draft2', 'ngram', 'draft2_kd'])
def test_end_to_end_power_one_row_at_a_time(fast, prompts, name):
    """draft2, the n-gram proposer and the distilled draft2 on the fast path, B = 1 (4,000 separate generations): the correct rule passes
    (2 tests at 0.1%); and the realistic bug, the correction drawn from p instead of the residual, is rejected (4,000 rows,
    10,000 for the n-gram proposer, in batches of 250: the planted rule is the same at any batch, and so is the law). Each
    proposer gets the validation prompt where that bug moves the law of token 2 most (`bias_shift`): after most prompts
    the n-gram guess is a token the target hardly allows, and the distilled drafter's law is so close to the target's
    that the bug hardly acts. The rejection rate over seeds, at 8,000 generations and for every proposer, is measured in
    08a_exactness (`e2e_power`, nbs/bench/e2e_power.json)."""
    t = fast['target']; mk = lambda: make_proposer(name, t, fast)
    p = max(prompts, key=lambda q: bias_shift(t, mk(), q))     # today's family: draft2 the 3rd prompt; ngram and draft2_kd the 6th (08a_exactness's table)
    r = e2e_test(t, mk, p, 4000, seed=7, chunk=1)
    assert r['stat'] < r['threshold'], f"{name}: chi2 {r['stat']:.1f} >= {r['threshold']:.1f} (false-failure rate at most 0.2%)"
    # the bug's rows sized from its shift: today's n-gram shift on its prompt (0.0129) is 2.5 times smaller than the older
    # family's (0.0322), for which 4,000 rows were enough, so the n-gram proposer gets 2.5 times the rows
    r = e2e_test(t, mk, p, 10_000 if name == 'ngram' else 4000, seed=7, chunk=250, mode='biased')
    assert r['stat'] >= r['threshold'], f"{name}: the planted bias was not rejected (chi2 {r['stat']:.1f} < {r['threshold']:.1f})"

def test_bias_shift_measures_the_bug(fast, cpu_models, prompts):
    """`bias_shift`, the chi-squared distance the realistic bug puts between token 2's law and p, is the n-gram proposer's
    p(d)(1 - p(d)) (`lookup_shift`) for a point-mass guess, vanishes for a drafter whose law is the target's own (the bug
    changes nothing where q = p: a formula that forgot beta or the min would not; the target's own passes as the drafter, its
    fp16 view, the trained weights exactly), and is far from zero for draft2."""
    t = fast['target']
    for q in prompts:
        assert bias_shift(t, make_proposer('ngram', t, fast), q) == pytest.approx(lookup_shift(t, q), rel=1e-4, abs=1e-9)
    same = bias_shift(t, DraftProposer(FastSmallem(cpu_models['target'], proposer_bf16=False)), prompts[0]); d2 = bias_shift(t, make_proposer('draft2', t, fast), prompts[0])
    assert same < 1e-6 and d2 > 0.01, (same, d2)

@pytest.mark.parametrize('name', ['draft2_kd', 'draft4_kd'])
def test_end_to_end_control_distilled(fast, prompts, name):
    """The gross control for the distilled drafters, whose law is close to the target's: every guess accepted without
    the test (the tokens then follow q) is rejected, 8 distinct prompts in batches of 250, 4,000 continuations. A
    statistic too blunt to tell q from p when they are this close would pass it; the realistic bug's power is measured
    in 08a_exactness (`bias_shift`, `e2e_power`) and tested above for draft2_kd."""
    r = e2e_test(fast['target'], lambda: make_proposer(name, fast['target'], fast), prompts[0], 4000, seed=7, chunk=250, prompts=prompts, mode='accept')
    assert r['stat'] >= r['threshold'], f"{name}: every guess accepted, yet chi2 {r['stat']:.1f} < {r['threshold']:.1f}"

@pytest.mark.parametrize('path', ['fast', 'reference'])
def test_laws_after_a_shared_head_are_the_whole_passes_laws(cpu_models, fast, prompts, path):
    """`law_test` computes the laws of many contexts that share a prompt from one pass over the prompt, copied into each
    row's cache (`tail`): the laws must be those of a pass over each whole context, on three prompts of two lengths and
    contexts of one to three generated tokens. A head's keys and values kept from the group before, or the values not
    copied, fail it (checked by planting each); the order of the slots within a row does not matter, each key carrying its
    position."""
    from smallem_spec.exactness import _laws_after
    t = fast['target'] if path == 'fast' else cpu_models['target']
    g = torch.Generator().manual_seed(0)
    heads = [tuple(prompts[0]), tuple(prompts[1]), tuple(prompts[2][:20])]
    pre = [h + tuple(torch.randint(0, 4096, (n,), generator=g).tolist()) for h in heads for n in (1, 2, 3) for _ in range(3)]
    for tail in (1, 2, 3):
        a, b = _laws_after(t, pre, 1.0), _laws_after(t, pre, 1.0, chunk=4, tail=tail)
        assert (a - b).abs().max() < 1e-5, f"tail {tail}: laws differ by {(a - b).abs().max():.2e}"
