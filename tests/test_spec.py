"Greedy speculative decoding equals plain greedy decoding; both caches hold exactly the accepted prefix; one pool serves many runs and gets every page back."
import pytest, torch
from smallem_spec.generate import generate
from smallem_spec.spec import speculative_generate, DraftProposer, ConstantProposer
from smallem_spec.verify import verify_greedy
from smallem_spec.core import SmallemError
from smallem_spec.fast import FastSmallem
from smallem_spec.mtp import make_proposer

NEW = 200

@pytest.fixture(scope='module')
def reference(cpu_models, prompts):
    return generate(cpu_models['target'], prompts, NEW)

@pytest.mark.parametrize('proposer', ['self', 'draft2', 'constant'])
def test_greedy_identity(cpu_models, prompts, reference, proposer):
    "8 validation prompts x 200 tokens, k = 1..4 at B = 8, and at B = 1 each prompt at two values of k (k = 1 and 3 for"
    "half the prompts, 2 and 4 for the other half: every prompt and every k, at half the time of all 32 pairs): exactly"
    "the target's greedy tokens. (The fast path's own test, tests/test_fast.py, runs every proposer on all of them.)"
    t = cpu_models['target']
    make = {'self': lambda: DraftProposer(t), 'draft2': lambda: DraftProposer(cpu_models['draft2']),
            'constant': lambda: ConstantProposer(t.cfg.vocab_size)}[proposer]
    for k in (1, 2, 3, 4):
        out, st = speculative_generate(t, make(), prompts, NEW, k)
        assert out == reference, f"{proposer}, k={k}, B=8: differs from plain greedy"
        if proposer == 'self': assert st['acceptance'] == 1.0, f"the target proposing for itself accepted {st['acceptance']}"
        for i, p in enumerate(prompts):
            if (i + k) % 2: continue
            o, _ = speculative_generate(t, make(), [p], NEW, k)
            assert o[0] == reference[i], f"{proposer}, k={k}, B=1, prompt {i}: differs from plain greedy"

@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_target_cache_holds_accepted_prefix(cpu_models, prompts, temperature):
    "After every round the target's cache equals a fresh prefill of the true text (minus the last token)."
    t = cpu_models['target']; worst = [0.]; rounds = [0]
    def check(cache, sids, out):
        cache.check()
        for b, s in enumerate(sids):
            if not out[b] or b % 3: continue                       # a third of the rows, to keep it quick
            text = prompts[b] + out[b]
            assert cache.length(s) == len(text) - 1, f"row {b}: cache holds {cache.length(s)} tokens, want {len(text) - 1}"
            got = t(torch.tensor([[text[-1]]]), cache, [s])[0, -1]
            cache.keep(s, len(text) - 1)
            ref = t(torch.tensor([text]))[0, -1]
            worst[0] = max(worst[0], (got - ref).abs().max().item())
        rounds[0] += 1
    speculative_generate(t, DraftProposer(cpu_models['draft2']), prompts, 60, 3, temperature,
                         torch.Generator().manual_seed(0), on_round=check)
    assert rounds[0] > 5 and worst[0] < 1e-3, f"cached logits differ from a fresh prefill by {worst[0]}"

def one_pool(monkeypatch, model, pools:list):
    "From now on every cache `model` makes is the same pool (one per kind: main, MTP), reused by every run."
    real, mine, ps = model.new_cache, {}, getattr(model, 'page_size', 16)
    def new_cache(*a, mtp=False, capacity=None, **kw):
        if mtp not in mine:
            mine[mtp] = real(n_pages=3 * model.cfg.max_seq_len // ps, mtp=mtp); pools.append(mine[mtp])   # three full contexts
        pool = mine[mtp]
        assert pool.n_free() == pool.n_pages and not pool.lens, f"a run starts on a pool still holding {pool.n_pages - pool.n_free()} pages"
        return pool
    monkeypatch.setattr(model, 'new_cache', new_cache)

class FreesOneRow(DraftProposer):
    "Planted leak for the negative control: finish() frees the first row's pages only."
    def finish(self): self.cache.free(self.sids[0])

@pytest.mark.parametrize('path', ['reference', 'fast'])
def test_one_pool_across_many_runs(cpu_models, prompts, monkeypatch, path):
    """One page pool per model and kind, reused by 12 runs (every proposer kind, B = 1..3, k = 1..4, greedy and sampled,
    one run stopped by the context, one aborted by an exception): after every round the pools hold their invariants
    (a rolled-back sequence owns just enough pages), after every run every page is back, greedy texts are the target's."""
    wrap = (lambda m: m) if path == 'reference' else (lambda m: FastSmallem(m, page_size=16))
    t, models = wrap(cpu_models['target']), {n: wrap(cpu_models[n]) for n in ('draft2', 'draft4')}
    C = t.cfg.max_seq_len; long = (prompts[0] * 8)[:C - 20]
    runs = [('draft2', 1, 1, 0.0, 40, prompts[:1]), ('mtp', 2, 3, 1.0, 40, prompts[1:3]), ('ngram', 3, 4, 0.0, 40, prompts[2:5]),
            ('draft4', 3, 2, 1.0, 30, prompts[3:6]), ('mtp', 1, 4, 0.0, 40, prompts[4:5]), ('draft2_v1024', 2, 3, 0.0, 40, prompts[5:7]),
            ('draft2', 2, 4, 0.0, 100, [long, prompts[6]]), ('mtp_v1024', 3, 2, 1.0, 30, prompts[5:8]), ('ngram', 2, 2, 1.0, 30, prompts[:2]),
            ('draft2', 3, 3, 0.0, 40, prompts[:3]), ('mtp', 3, 1, 0.0, 30, prompts[1:4]), ('draft4', 1, 3, 0.0, 40, prompts[7:8])]
    plain = {i: [generate(t, [p], n)[0] for p in ps] for i, (_, _, _, T, n, ps) in enumerate(runs) if T == 0}   # fresh caches, row by row
    pools = []
    for m in (t, *models.values()): one_pool(monkeypatch, m, pools)
    def check_all(*_):
        for pool in pools: pool.check()
    def emptied(what):
        for pool in pools:
            pool.check()
            assert pool.n_free() == pool.n_pages and not pool.lens, f"{what}: {pool.n_pages - pool.n_free()} pages not returned to {pool}"
    for i, (name, B, k, T, n, ps) in enumerate(runs):
        out, st = speculative_generate(t, make_proposer(name, t, models, 'cpu'), ps, n, k, T, torch.Generator().manual_seed(i), on_round=check_all)
        emptied(f"run {i} ({name}, B={B}, k={k}, T={T})")
        if T == 0: assert out == plain[i], f"run {i} ({name}): greedy text differs from the target's on a reused pool"
    assert st['rounds'] > 5 and len(pools) == 4     # target, target's MTP module, draft2, draft4
    def boom(cache, sids, out):
        if len(out[0]) > 10: raise RuntimeError('stop')
    with pytest.raises(RuntimeError, match='stop'): speculative_generate(t, make_proposer('draft2', t, models, 'cpu'), prompts[:3], 40, 3, on_round=boom)
    emptied("a run aborted by an exception")
    speculative_generate(t, FreesOneRow(models['draft2']), prompts[:2], 10, 2)     # the negative control: a leak is seen
    with pytest.raises(AssertionError, match='pages not returned'): emptied("the planted leak")

def test_bad_input(cpu_models, prompts):
    t, d = cpu_models['target'], DraftProposer(cpu_models['draft2'])
    cases = [(dict(k=0), 'k must be'), (dict(k=10_000), 'does not fit the context'), (dict(temperature=-0.5), 'temperature'),
             (dict(temperature=float('nan')), 'temperature'), (dict(max_new_tokens=-1), 'max_new_tokens'),
             (dict(prompts=[[]]), 'prompt 0 is empty'), (dict(prompts=[[1, 99999]]), 'outside the vocabulary')]
    for kw, msg in cases:
        args = dict(target=t, proposer=d, prompts=prompts[:1], max_new_tokens=5, k=2); args.update(kw)
        with pytest.raises(SmallemError, match=msg): speculative_generate(**args)
    with pytest.raises(SmallemError, match='vocabulary'): speculative_generate(t, ConstantProposer(100), prompts[:1], 5, 2)
    with pytest.raises(SmallemError, match='does not match'): verify_greedy(torch.zeros(2, 3, 10), torch.zeros(2, 3, dtype=torch.long))
    out, _ = speculative_generate(t, d, prompts[:1], 5, 2)   # still usable afterwards
    assert len(out[0]) == 5

def test_ngram_guesses_on_the_targets_device():
    "The n-gram proposer's guesses live where the target's tensors do (on CUDA they were once left on the CPU: the"
    "first round failed in torch.cat; found by tools/gpu_check.sh). The meta device stands in for a GPU here."
    from smallem_spec.proposers import NGramProposer
    p = NGramProposer(3, 50, device='meta'); p.start([[1, 2, 3, 1, 2]], [3])
    d, q = p.propose([0], [2], temperature=1.0)
    assert d.device.type == 'meta' and q.device.type == 'meta' and d.shape == (1, 2)
    class Target: device, cfg = torch.device('meta'), type('C', (), {'vocab_size': 50})
    assert make_proposer('ngram', Target(), {}).device.type == 'meta'

def test_drafter_catches_up_on_its_last_tokens(cpu_models, prompts):
    "A text begun with plain steps (the adaptive policy carries a stretch over from the text before): the drafter's first"
    "proposal reads the last `catchup` tokens, not the whole text (draft4 once read 232 tokens there, a round that cost 42"
    "plain steps on an AMD EPYC); a text begun with a round still reads its whole prompt."
    from smallem_spec.fast import FastSmallem
    d2, p = FastSmallem(cpu_models['draft2']), prompts[0]
    late = DraftProposer(d2); late.start([p], [5]); late.accept([0], [list(range(10, 110))])   # 100 plain steps
    late.propose([0], [2])
    assert late.cache.length(late.sids[0]) == late.catchup + 1, "read the last 32 tokens, then appended one guess"
    fresh = DraftProposer(d2); fresh.start([p], [5]); fresh.propose([0], [2])
    assert fresh.cache.length(fresh.sids[0]) == len(p) + 1 + 1, "the prompt, its first token, one guess"

def test_mtp_catches_up_on_its_last_states(cpu_models, prompts):
    "The same for the MTP module: after 100 plain steps its first proposal reads the last `catchup` hidden states (it read"
    "all 132 pending ones before: on an AMD EPYC the adaptive policy measured that first round at up to 5-6 plain steps"
    "more than a usual one, more after longer stretches); a text begun with a round reads its whole prompt."
    from smallem_spec.fast import FastSmallem
    from smallem_spec.mtp import MTPProposer
    t, p = FastSmallem(cpu_models['target']), prompts[0]; D = t.cfg.dim
    late = MTPProposer(t); late.start([p], [5], torch.randn(1, len(p), D)); late.accept([0], [list(range(10, 110))], torch.randn(1, 100, D))
    late.propose([0], [2])
    assert late.cache.length(late.sids[0]) == late.catchup + 1, "read the last 32 states, then chained one guess"
    blind = MTPProposer(t, catchup=10 ** 6); blind.start([p], [5], torch.randn(1, len(p), D)); blind.accept([0], [list(range(10, 110))], torch.randn(1, 100, D))
    blind.propose([0], [2])
    assert blind.cache.length(blind.sids[0]) == len(p) + 100 + 1, "the control: without the limit, every pending state"
    fresh = MTPProposer(t); fresh.start([p], [5], torch.randn(1, len(p), D)); fresh.propose([0], [2])
    assert fresh.cache.length(fresh.sids[0]) == len(p) + 1, "the prompt's states, then one guess"

def test_stats_from_a_log_with_plain_steps():
    "SpecStats.from_log skips a policy's plain steps (k = 0) without reading their rows: on 300 random logs mixing plain"
    "steps and rounds (rows of different k, some at 0), every count equals a by-hand count over every entry."
    import random
    from smallem_spec.spec import SpecStats, PARTS
    rng = random.Random(0)
    for _ in range(300):
        K, A, log = rng.randint(1, 6), rng.randint(1, 4), []
        for _ in range(rng.randint(0, 40)):
            if rng.random() < 0.4: log += [(0, [0] * A, [0] * A)] * rng.randint(1, 5)
            else:
                kr = rng.randint(1, K); ks = [rng.randint(0, kr) for _ in range(A)]; ks[0] = kr
                log.append((kr, ks, [rng.randint(0, kb) for kb in ks]))
        st = SpecStats.from_log(log, K, [[1] * 3] * A, dict.fromkeys(PARTS, 0.0), 0.0, [])
        pp = [sum(1 for _, ks, ns in log for kb, nb in zip(ks, ns) if j < kb and j <= nb) for j in range(K)]
        pa = [sum(1 for _, ks, ns in log for nb in ns if j < nb) for j in range(K)]
        assert (st.rounds, st.row_rounds, st.proposed, st.accepted) == (len(log), A * len(log), sum(sum(ks) for _, ks, _ in log), sum(sum(ns) for _, _, ns in log))
        assert st.pos_proposed == pp and st.pos_accepted == pa and st.k_used == [kr for kr, _, _ in log] and st.new_tokens == 3 * A

@pytest.mark.parametrize('path', ['fused', 'python'])
def test_prefill_is_a_part_of_its_own(cpu_models, prompts, monkeypatch, path):
    "Both loops time the prompts' pass as `t_parts['prefill']`, apart from the rounds' parts (a round's time beyond its"
    "passes is then t_host - prefill); the times of the parts never add up to more than the whole generation."
    monkeypatch.setenv('SMALLEM_ROUNDS', path)
    t = FastSmallem(cpu_models['target'])
    import smallem_spec.fused as fm
    ran, whole = [], fm.FusedPass.generate_rounds   # which loop wrote the text: the library's rounds, or 05's (they return None)
    monkeypatch.setattr(fm.FusedPass, 'generate_rounds', lambda self, *a, **kw: ran.append(whole(self, *a, **kw)) or ran[-1])
    _, st = speculative_generate(t, make_proposer('mtp', t, {}), prompts[:2], 40, 2)
    if getattr(t, 'fused', None) is not None:   # without a C compiler there is no library and only 05's loop
        assert len(ran) == 1 and (ran[0] is not None) == (path == 'fused'), path
    assert st.t_parts['prefill'] > 0 and sum(st.t_parts.values()) <= st.t_total and st.t_host >= st.t_parts['prefill']
    # the target alone's runs keep theirs too (the benchmark's plain step leaves them out): seconds and one pass a chunk
    from smallem_spec.bench import run_config, _plain_step
    r = run_config(t, {}, prompts[:2], 40, 'none', 0, 0.0, 1, None)
    assert 0 < r['prefill'] < r['seconds'] and r['prefills'] == 2 and r['passes'] == 80 and 0 < _plain_step(r) < r['seconds'] / r['passes']
