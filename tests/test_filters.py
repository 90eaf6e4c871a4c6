"""Top-k, top-p and min-p (04_generate, 06a_filters): the filtered law, exactness of speculative sampling under a filter,
and the two real filter bugs (the ratio with the unfiltered q; the filter on the bonus token only) planted and caught.

False-failure rates: test_toy_filters runs 9 chi-squared tests at 0.1% (0.9% for the file's toy test);
test_e2e_filters runs 1 test against the exact filtered law on the worse of two positions at 0.1% each (0.2%). The others are exact checks."""
import pytest, torch
from smallem_spec.core import SmallemError, argmax
from smallem_spec.generate import generate, probs_at, filter_probs, sampling, Sampling
from smallem_spec.filters import toy_filter_run, outside_support
from smallem_spec.spec import speculative_generate
from smallem_spec.mtp import PROPOSERS, make_proposer
from smallem_spec.exactness import e2e_test
from smallem_spec.fast import FastSmallem

FILTERS = [dict(top_k=8), dict(top_p=0.8), dict(min_p=0.1)]

@pytest.fixture(scope='module')
def fast(cpu_models):
    return {n: FastSmallem(m) for n, m in cpu_models.items()}

def test_filter_definitions():
    "Each filter keeps what its definition says, renormalised; top-k = 1 is the argmax (ties: the lower id)."
    p = torch.tensor([0.30, 0.25, 0.20, 0.10, 0.08, 0.04, 0.02, 0.01])
    assert (filter_probs(p, top_k=3) > 0).tolist() == [True] * 3 + [False] * 5
    assert (filter_probs(p, top_p=0.75) > 0).tolist() == [True] * 3 + [False] * 5      # 0.30 + 0.25 + 0.20 reaches 0.75
    assert (filter_probs(p, top_p=0.76) > 0).tolist() == [True] * 4 + [False] * 4
    assert (filter_probs(p, min_p=0.3) > 0).tolist() == (p >= 0.09).tolist()
    assert torch.allclose(filter_probs(p, top_k=2), torch.tensor([0.30, 0.25] + [0.0] * 6) / 0.55)
    assert (filter_probs(torch.tensor([0.2, 0.4, 0.4]), top_k=1) > 0).tolist() == [False, True, False]   # tie: the lower id
    lg = torch.randn(32, 4096)
    assert torch.equal(filter_probs(probs_at(lg, 1.0), top_k=1).argmax(-1), argmax(lg))
    both = filter_probs(probs_at(lg, 0.8), top_k=50, top_p=0.9, min_p=0.02)
    assert torch.allclose(both.sum(-1), torch.ones(32)) and ((both > 0).sum(-1) <= 50).all()

@pytest.mark.parametrize('kw,msg', [(dict(top_k=0), 'top_k must be'), (dict(top_k=True), 'top_k must be'), (dict(top_p=0.0), 'top_p must be'),
                                    (dict(top_p=1.01), 'top_p must be'), (dict(min_p=1.0), 'min_p must be'), (dict(min_p=float('nan')), 'min_p must be')])
def test_bad_filter_values(kw, msg):
    with pytest.raises(SmallemError, match=msg): sampling(0.8, **kw)

def test_filter_at_temperature_zero_and_state(fast, prompts):
    "A filter at temperature 0 is refused, and a bad filter value on the speculative path, both before anything runs; the temperature a Sampling prints is the bare number."
    t = fast['target']
    with pytest.raises(SmallemError, match='set a temperature > 0'): generate(t, prompts[:1], 4, 0.0, top_k=5)
    with pytest.raises(SmallemError, match='top_p must be'): speculative_generate(t, make_proposer('mtp', t, {}), prompts[:1], 4, 2, 0.8, top_p=2.0)
    assert type(sampling(0.8)) is float and isinstance(sampling(0.8, min_p=0.1), Sampling) and str(sampling(0.8, top_k=3)) == '0.8'

BAD_FILTERS = [('smallem_generate', ['--temperature', '0', '--top-k', '5'], 'set a temperature > 0'),
               ('smallem_generate', ['--temperature', '1', '--top-p', '0'], 'top_p must be'),
               ('smallem_bench', ['--temperature', '0.8', '--min-p', '1.5'], 'min_p must be'),
               ('smallem_bench', ['--temperature', '0', '--top-k', '3'], 'add a temperature > 0'),
               ('smallem_exactness', ['--top-k', '0'], 'top_k must be')]

@pytest.fixture(scope='module')
def refused_filters(run_commands, tmp_path_factory):
    return run_commands([(cmd, args, tmp_path_factory.mktemp('filters')) for cmd, args, _ in BAD_FILTERS])

@pytest.mark.parametrize('i', range(len(BAD_FILTERS)), ids=[f'{c}-{m}' for c, _, m in BAD_FILTERS])
def test_commands_refuse_bad_filters(refused_filters, i):
    "One line naming the argument, exit 2, no traceback (the commands' entry points, run as tests/run_commands.py runs them)."
    (cmd, _, msg), r = BAD_FILTERS[i], refused_filters[i]
    assert r.rc == 2 and 'Traceback' not in r.stderr and msg in r.stderr, (r.rc, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 or r.stderr.strip().splitlines()[-1].startswith(f'{cmd}: error:'), r.stderr

def test_top_k_1_is_greedy(fast, prompts):
    "With one token kept, sampled text equals greedy text, plain and speculative, for every proposer (batch 8)."
    t, models = fast['target'], {b: fast[b] for b in ('draft2', 'draft4')}
    greedy = generate(t, prompts, 40)
    g = torch.Generator().manual_seed(0)
    assert generate(t, prompts, 40, 0.8, g, top_k=1) == greedy
    for name in PROPOSERS:
        assert speculative_generate(t, make_proposer(name, t, models), prompts, 40, 3, 0.8, g, top_k=1)[0] == greedy, name
        assert speculative_generate(t, make_proposer(name, t, models), prompts, 40, 2, 1.0, g, top_p=1e-6)[0] == greedy, name

def test_toy_filters():
    "The rule alone on toy laws: under each filter the correct rule passes at 3 positions; both planted bugs are rejected."
    for filt in FILTERS:
        res = toy_filter_run(filt)[0]
        assert all(r['stat'] < r['threshold'] for r in res), (filt, res)
        for bug in ('raw_q', 'bonus_only'):
            assert any(r['stat'] >= r['threshold'] for r in toy_filter_run(filt, bug)[0]), (filt, bug)

def test_no_token_outside_the_support(fast, prompts):
    "Filtered generations, plain and speculative, emit no token the filter removed; the bonus-only bug does (its control)."
    t, models = fast['target'], {'draft2': fast['draft2']}
    g = torch.Generator().manual_seed(1)
    T = sampling(0.8, min_p=0.1)
    outs = [generate(t, prompts, 48, T, g)] + [speculative_generate(t, make_proposer(n, t, models), prompts, 48, 3, T, g)[0] for n in ('draft2', 'mtp')]
    assert all(outside_support(t, prompts, o, T) == 0 for o in outs)
    bad = speculative_generate(t, make_proposer('draft2', t, models), prompts, 48, 3, T.planted('bonus_only'), g)[0]
    assert outside_support(t, prompts, bad, T) > 0, "the planted bug (filter on the bonus token only) emitted nothing outside the support"

def test_e2e_filters(fast, prompts):
    "Tokens 2-3 of 1500 continuations at T = 0.8, top-k = 20, draft2 (fast path): passes; both planted bugs rejected."
    t, d2 = fast['target'], fast['draft2']
    T = sampling(0.8, top_k=20)
    mk = lambda: make_proposer('draft2', t, {'draft2': d2})
    r = e2e_test(t, mk, prompts[0], 1500, temperature=T, seed=3, chunk=250)
    assert r['stat'] < r['threshold'], f"speculative vs the exact law under top_k=20: chi2 {r['stat']:.1f} >= {r['threshold']:.1f}"
    for mode in ('raw_q', 'bonus_only'):
        r = e2e_test(t, mk, prompts[0], 1500, temperature=T, seed=3, chunk=250, mode=mode)
        assert r['stat'] > r['threshold'], f"planted bug {mode} not rejected: chi2 {r['stat']:.1f} <= {r['threshold']:.1f}"

def _by_sorting(p, top_k=None, top_p=None, min_p=None):
    "The definition, written the slow way: a stable sort, a float64 cumulative sum, a scatter back."
    keep = torch.ones_like(p, dtype=torch.bool)
    if top_k is not None or top_p is not None:
        ps, order = torch.sort(p, dim=-1, descending=True, stable=True)
        kept = torch.ones_like(ps, dtype=torch.bool)
        if top_k is not None: kept[..., top_k:] = False
        if top_p is not None:
            m = (ps * kept).double(); kept &= m.cumsum(-1) - m < top_p * m.sum(-1, keepdim=True)
        keep = torch.zeros_like(keep).scatter(-1, order, kept)
    if min_p is not None: keep &= p >= min_p * p.amax(-1, keepdim=True)
    q = p * keep
    return q / q.sum(-1, keepdim=True)

def test_filter_probs_equals_the_definition():
    "filter_probs (top-k values and thresholds, a full sort only where 64 tokens hold too little) keeps exactly what sorting keeps, ties included."
    g = torch.Generator().manual_seed(0)
    for scale in (0.3, 1.0, 3.0, 8.0):
        lg = torch.randn(32, 4096, generator=g) * scale
        lg[0, :10] = 5.0; lg[1] = 0.0; lg[2, 100:300] = 9.0             # ties at the top, everywhere, and across a boundary
        for T in (0.5, 1.0, 2.0):
            p = probs_at(lg, T)
            for kw in (dict(top_k=1), dict(top_k=20), dict(top_k=100), dict(top_k=5000), dict(top_p=0.9), dict(top_p=0.5), dict(top_p=1.0),
                       dict(top_p=1e-6), dict(top_k=20, top_p=0.9), dict(top_k=200, top_p=0.95, min_p=0.01), dict(min_p=0.1)):
                a, b = filter_probs(p, **kw), _by_sorting(p, **kw)
                assert torch.equal(a > 0, b > 0) and torch.allclose(a, b), (scale, T, kw)
