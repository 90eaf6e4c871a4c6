"""The fast path computes the reference model's function: logits, caches, greedy identity for every proposer,
the graph bookkeeping (emulated on the CPU), and the end-to-end sampling test with its negative control.
Statistics: 2 chi-squared tests at 0.1% (tokens 2 and 3 of the end-to-end test), so a false-failure rate of at most 0.2%."""
import pytest, torch
from smallem_spec.fast import FastSmallem
from smallem_spec.generate import generate
from smallem_spec.spec import speculative_generate, DraftProposer
from smallem_spec.mtp import MTPProposer
from smallem_spec.proposers import ngram_for
from smallem_spec.exactness import e2e_test
from smallem_spec.core import SmallemError

@pytest.fixture(scope='module')
def fast(cpu_models):
    return {n: FastSmallem(m) for n, m in cpu_models.items()}

@pytest.mark.parametrize('kw', [dict(), dict(page_size=16), dict(script=False), dict(graphs='emulate')])
def test_logits_match_reference(cpu_models, kw):
    t = cpu_models['target']; f = FastSmallem(t, proposer_bf16=False, **kw)   # the MTP module in fp32 too: the model's function to float rounding
    x = torch.randint(1, t.cfg.vocab_size, (3, 140), generator=torch.Generator().manual_seed(1))   # rows past 64 and 128 keys (the kernel's chunks)
    with torch.inference_mode():
        ref, ref_h = t(x, return_hidden=True)
        c = f.new_cache(capacity=[140] * 3); s = [c.new_seq() for _ in range(3)]
        n = [126, 60, 95]
        a = f(x[:, :126], c, s, n_new=n)
        for step in range(4):   # one token at a time, ragged rows: the decode shapes
            b = f(torch.stack([x[i, m + step:m + step + 1] for i, m in enumerate(n)]), c, s)
            for i, m in enumerate(n): assert (b[i, 0] - ref[i, m + step]).abs().max() < 1e-4, f"{kw}: row {i} step {step}"
        for i, m in enumerate(n): assert (a[i, :m] - ref[i, :m]).abs().max() < 1e-4, f"{kw}: prefill row {i}"
        c.check()
        lr, sr = t.mtp_forward(ref_h[:, :-1], x[:, 1:]); lf, sf = f.mtp_forward(ref_h[:, :-1], x[:, 1:])
        assert (lf - lr).abs().max() < 1e-4 and (sf - sr).abs().max() < 1e-4, f"{kw}: MTP module differs"

def test_graph_pool_is_shared_one_cache_at_a_time(cpu_models):
    f = FastSmallem(cpu_models['target'], graphs='emulate')
    a = f.new_cache(capacity=[100]); sa = a.new_seq(); a.append([sa], [3])
    b = f.new_cache(capacity=[100])                       # a still holds a sequence: b must not share its storage
    assert a.pool is not None and b.pool is None
    a.free(sa)
    c = f.new_cache(capacity=[100, 100])                  # a is empty now: c takes the pool (grown to two pages)
    assert c.pool is not None and c.pool.shape[1] >= 3 * f.cfg.max_seq_len

def test_cpu_cache_storage_reused_once_released(cpu_models):
    "Without graphs a new cache takes the storage of the last one of its kind once nothing holds it (neither that cache nor"
    "a view of its keys): a text no longer allocates and zeroes its megabytes. The control: a view kept alive keeps it."
    f = FastSmallem(cpu_models['draft2'], graphs=False)
    a = f.new_cache(capacity=[200]); pa = a.kv.data_ptr(); del a
    b = f.new_cache(capacity=[100])                       # smaller: a prefix of the same storage, contiguous
    assert b.kv.data_ptr() == pa and b.kv.is_contiguous()
    keys = b.k; del b                                      # a view of b's keys still lives
    c = f.new_cache(capacity=[100])
    assert c.kv.data_ptr() != pa
    big = f.new_cache(capacity=[200, 200])                # larger than any spare: its own storage
    assert big.kv.data_ptr() not in (pa, c.kv.data_ptr()) and keys.shape[0] == f.cfg.n_layers

@pytest.mark.parametrize('B', [1, 8])
def test_greedy_identity_fast_path(cpu_models, fast, prompts, B):
    "8 prompts x 200 tokens: fast plain == reference plain, and every proposer on the fast path == fast plain (k = 1..3)."
    t = fast['target']
    chunks = [prompts[i:i + B] for i in range(0, len(prompts), B)]
    plain = [o for ch in chunks for o in generate(t, ch, 200)]
    assert plain == [o for ch in chunks for o in generate(cpu_models['target'], ch, 200)], "fast and reference greedy texts differ"
    makers = {'draft2': lambda: DraftProposer(fast['draft2']), 'draft4': lambda: DraftProposer(fast['draft4']),
              'mtp': lambda: MTPProposer(t), 'ngram': lambda: ngram_for(t)}
    for name, mk in makers.items():
        for k in (1, 2, 3):
            out = [o for ch in chunks for o in speculative_generate(t, mk(), ch, 200, k)[0]]
            assert out == plain, f"{name}, k={k}, B={B}: differs from plain greedy on the fast path"
    class Alternate:   # stretches of 40 plain steps between 3 rounds at k = 3: every catch-up restarts on the last 32 tokens or states
        def __init__(self): self.i, self.steps = 0, 1
        def choose(self):
            self.i += 1; self.steps = 40 if self.i % 4 == 0 else 1
            return 0 if self.i % 4 == 0 else 3
        def update(self, *a, **kw): pass
    for name in ('draft2', 'mtp'):
        out = [o for ch in chunks for o in speculative_generate(t, makers[name](), ch, 200, 3, k_policy=Alternate())[0]]
        assert out == plain, f"{name}, plain stretches between rounds, B={B}: differs from plain greedy on the fast path"

def test_graphs_emulated_greedy_identity(cpu_models, prompts):
    "The static-shape path the CUDA graphs replay (padded context, pooled cache) gives the same greedy texts."
    g = FastSmallem(cpu_models['target'], graphs='emulate')
    plain = generate(cpu_models['target'], prompts[:4], 60)
    assert generate(g, prompts[:4], 60) == plain
    assert speculative_generate(g, MTPProposer(g), prompts[:4], 60, 2)[0] == plain
    assert len(g._graphs) >= 2, "no graph shapes were recorded"

def test_end_to_end_sampling_fast_path(fast, prompts):
    "Tokens 2-3 of 4000 speculative continuations (MTP, fast path) against the exact law: 2 chi-squared tests at 0.1%"
    "(false-failure rate at most 0.2%). Its negative control, every proposal accepted, is rejected on the same prompt and"
    "seed in tests/test_draft_vocab.py (the MTP module over 256 tokens), the realistic bug in tests/test_verify.py."
    t = fast['target']
    r = e2e_test(t, lambda: MTPProposer(t), prompts[0], 4000, seed=4)
    assert r['stat'] < r['threshold'], f"speculative vs the exact law: chi2 {r['stat']:.1f} >= {r['threshold']:.1f} (false-failure rate at most 0.2%)"

def test_bad_inputs(cpu_models):
    f = FastSmallem(cpu_models['target'])
    with pytest.raises(SmallemError, match='exceed the context'): f(torch.ones(1, 300, dtype=torch.long))
    with pytest.raises(SmallemError, match='does not divide'): FastSmallem(cpu_models['target'], page_size=100)
    with pytest.raises(SmallemError, match='no MTP module'): FastSmallem(cpu_models['draft2']).mtp_forward(torch.zeros(1, 1, 192), torch.ones(1, 1, dtype=torch.long))
    c = f.new_cache(capacity=[256]); s = c.new_seq(); f(torch.ones(1, 200, dtype=torch.long), c, [s])
    with pytest.raises(SmallemError, match='past the context'): f(torch.ones(1, 100, dtype=torch.long), c, [s])
    assert c.length(s) == 200, "a refused pass changed the cache"
