"Cache fuzzing: random append / verify-then-keep / free sequences against the dense reference."
import random
import pytest, torch
from smallem_spec.cache import PagedKVCache, DenseCache, dense_attention, paged_attention
from smallem_spec.core import SmallemError

N_WALKS = 2000

def walk(seed, n_ops=12, H=2, D=4, page_size=4, n_pages=24, max_len=48):
    "One seeded walk over several sequences sharing a pool; returns the worst attention error."
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    paged, dense, live, worst = PagedKVCache(1, H, D, n_pages, page_size, max_len), DenseCache(1), [], 0.
    for _ in range(n_ops):
        op = rng.random()
        if op < 0.15 or not live:
            s = paged.new_seq(); dense.new_seq(s); live.append(s)
        elif op < 0.25:
            s = live.pop(rng.randrange(len(live))); paged.free(s)
        else:
            sids = rng.sample(live, rng.randint(1, len(live)))
            ns = [rng.randint(0, 6) for _ in sids]; T = max(max(ns), 1)
            before = (dict(paged.lens), {s: list(p) for s, p in paged.pages.items()}, list(paged.free_pages))
            starts = [paged.length(s) for s in sids]
            q, k, v = (torch.randn(len(sids), T, H, D, generator=g) for _ in range(3))
            try: plan = paged.plan(sids, ns, T)
            except SmallemError as e:   # refused: nothing may have changed
                assert 'exhausted' in str(e) or 'context' in str(e), str(e)
                assert (dict(paged.lens), {s: list(p) for s, p in paged.pages.items()}, list(paged.free_pages)) == before
                continue
            out = paged_attention(paged, 0, plan, q, k, v)
            for i, (s, n) in enumerate(zip(sids, ns)):
                if n == 0: continue
                dense.append(s, 0, k[i, :n], v[i, :n])
                ref = dense_attention(q[i, :n], dense.k[s][0], dense.v[s][0], starts[i])
                worst = max(worst, (out[i, :n] - ref).abs().max().item())
                if op > 0.6:   # verify-then-keep: roll back a random number of the new tokens
                    keep = starts[i] + rng.randint(0, n)
                    paged.keep(s, keep); dense.keep(s, keep)
        paged.check()
    for s in live: paged.free(s)
    paged.check()
    assert paged.n_free() == paged.n_pages, f"seed {seed}: pages leaked"
    return worst

def test_fuzz_paged_vs_dense():
    worst = 0.
    for seed in range(N_WALKS):
        try: w = walk(seed)
        except AssertionError as e: raise AssertionError(f"walk with seed {seed} failed: {e}") from e
        assert w < 1e-5, f"seed {seed}: paged attention differs from dense by {w}"
        worst = max(worst, w)
    print(f"{N_WALKS} walks, worst |paged - dense| = {worst:.2e}")

def test_keep_bad_arguments_leave_state():
    c = PagedKVCache(1, 1, 2, 4, 4, 16); s = c.new_seq(); c.append([s], [5])
    for n in (-1, 6):
        with pytest.raises(SmallemError, match=r'keep\('): c.keep(s, n)
    assert c.length(s) == 5 and c.n_free() == 2
    with pytest.raises(SmallemError, match='unknown sequence'): c.keep(99, 0)
