"""The cost model (smallem_spec.cost) and the benchmark's prediction (smallem_spec.bench._predict, _grid_row) against
numbers computed by hand, and the k policies (HeuristicK, AdaptiveK with timed=False) driven by proposers whose
acceptance is known exactly. Deterministic: no statistics, no timing."""
import dataclasses
import pytest, torch
from smallem_spec.core import SmallemError
from smallem_spec.cost import (expected_tokens, expected_tokens_pos, round_cost, predicted_speedup, alpha_for, best_k,
                               measure_v, AdaptiveK, HeuristicK)
from smallem_spec.bench import _predict, _grid_row
from smallem_spec.generate import generate
from smallem_spec.spec import Proposer, speculative_generate

class Oracle(Proposer):
    "Knows the target's greedy text: the first `right` guesses of every round are its next tokens, the rest are wrong (None: all right)."
    def __init__(self, ref:list[list[int]], vocab_size:int, right=None): self.ref, self.vocab_size, self.right = ref, vocab_size, right
    def start(self, prompts, first_tokens, hidden=None, capacity=None): self.pos = [1] * len(prompts)   # tokens of ref emitted so far
    def propose(self, rows, ks, temperature=0.0, generator=None):
        K, out = max(ks), []
        for r in rows:
            g = (self.ref[r] + [0] * (K + 1))[self.pos[r]:self.pos[r] + K]
            out.append([x if self.right is None or j < self.right else (x + 1) % self.vocab_size for j, x in enumerate(g)])
        return torch.tensor(out), None
    def accept(self, rows, emitted, hidden=None):
        for r, em in zip(rows, emitted): self.pos[r] += len(em)

@pytest.fixture(scope='module')
def target(cpu_models): return cpu_models['target']

@pytest.fixture(scope='module')
def ref(target, prompts): return generate(target, prompts[:1], 64)

def test_expected_tokens():
    assert expected_tokens(0.5, 2) == 1.75 and expected_tokens(1.0, 3) == 4.0 and expected_tokens(0.0, 3) == 1.0
    assert expected_tokens(0.8, 4) == pytest.approx(1 + .8 + .64 + .512 + .4096, abs=1e-12)
    assert expected_tokens_pos([0.5, 0.5]) == 1.75 and expected_tokens_pos([]) == 1.0
    assert expected_tokens_pos([1.0, 0.5, 0.0, 1.0]) == 2.5            # 1 + 1 + 1·0.5 + 0 + 0: nothing after a certain refusal
    assert expected_tokens_pos([0.9] * 5) == pytest.approx(expected_tokens(0.9, 5), abs=1e-12)
    for a in (-0.1, 1.5): pytest.raises(SmallemError, expected_tokens, a, 2)
    assert alpha_for(1.75, 2) == pytest.approx(0.5, abs=1e-12) and alpha_for(expected_tokens(0.3, 4), 4) == pytest.approx(0.3, abs=1e-12)

def test_round_cost_speedup_best_k():
    assert round_cost(3, 0.1, 1.5) == pytest.approx(1.8, abs=1e-12)
    assert round_cost(3, 0.1, lambda k: 1 + 0.25 * k) == pytest.approx(2.05, abs=1e-12)      # v may be a function of k
    assert predicted_speedup([0.5, 0.5], 0.25, 1.0, host=0.25) == pytest.approx(1.75 / 1.75, abs=1e-12)
    assert predicted_speedup([1.0] * 4, 0.0, lambda k: 1.0) == 5.0                          # free and always right: k + 1
    # α = 0.9, 0.5, 0.1, c = 0.1, v = 1: k=1 1.9/1.1 = 1.727, k=2 2.35/1.2 = 1.958, k=3 2.395/1.3 = 1.842
    k, s = best_k([0.9, 0.5, 0.1], 0.1, lambda k: 1.0)
    assert k == 2 and s == pytest.approx(2.35 / 1.2, abs=1e-12)
    assert best_k([1.0] * 6, 0.0, 1.0) == (6, 7.0) and best_k([0.0] * 6, 0.5, 1.0) == (1, 1 / 1.5)
    pytest.raises(SmallemError, best_k, [], 0.1, 1.0)

def test_predict_by_hand():
    "The benchmark's prediction: tokens over time, summed over the rounds' k (k = 0 a plain step), with every cost term."
    v, s = {0: 1.0, 2: 1.5, 3: 1.6}, {2: 0.05, 3: 0.08}
    # two rounds at k = 2 with α = 0.5, 0.5: 2 · 1.75 tokens; each costs v(2)·t_unit + (c0 + 2c + s(2))·t1 + host
    got = _predict([0.5, 0.5], [2, 2], 0.25, v, t_step=0.002, host=0.0001, s=s, t_unit=0.001, t1=0.0015, c0=0.05)
    assert got == pytest.approx(2 * 1.75 * 0.002 / (2 * (1.5 * 0.001 + (0.05 + 0.5 + 0.05) * 0.0015 + 0.0001)), rel=1e-12)
    # a plain step (k = 0) is one token for t_step + host; at batch > 1 the occupancy scales the tokens
    got = _predict([1.0, 0.5, 0.0], [3, 0, 2], 0.1, v, t_step=0.002, host=0.0002, s=s, occupancy=0.75)
    num = 0.75 * (2.5 + 1 + 2.5) * 0.002             # E(1, 0.5, 0) = E(1, 0.5) = 2.5
    den = (1.6 * 0.002 + (0.3 + 0.08) * 0.002 + 0.0002) + (0.002 + 0.0002) + (1.5 * 0.002 + (0.2 + 0.05) * 0.002 + 0.0002)
    assert got == pytest.approx(num / den, rel=1e-12)
    assert _predict([1.0], [1], 0.0, {1: 1.0}, 0.001, 0.0) == 2.0 and _predict([0.5], [], 0.1, v, 0.001, 0.0) is None

def test_grid_row_predicts_a_known_proposer_exactly(target, prompts, ref):
    """A proposer right on its first two guesses and wrong on the third, at k = 3 over 64 tokens: the loop must count
    α = 1, 1, 0 and 3 tokens a round, and the benchmark's row must predict from them and from given costs exactly."""
    V = target.cfg.vocab_size
    out, st = speculative_generate(target, Oracle(ref, V, right=2), prompts[:1], 64, 3)
    assert out == ref
    assert st.alpha_per_position == [1.0, 1.0, 0.0] and st.tokens_per_round == 3.0 and st.rounds == 21 and st.k_used == [3] * 21
    # known times: a plain step 2 ms (t_step = t_unit = t1), host 0.3 ms a round, costs v(3) = 1.5, c0 = 0.05, c = 0.1, s(3) = 0.05
    st = dataclasses.replace(st, t_parts={**dict.fromkeys(st.t_parts, 0.0), 'propose': 0.01, 'verify': 0.05}, t_total=0.06 + 21 * 0.0003)
    res = dict(seconds=0.1, tokens=64, texts=out, row_slots=21, stats=st)
    base = dict(seconds=0.2, passes=100, tokens=64, texts=ref, row_slots=0, stats=None)
    raw = {('none', 0, 0.0, 1): [(base, None, None)], ('draft2', 3, 0.0, 1): [(res, 320.0, (base, base))]}
    costs = {1: dict(t1=0.002, v={3: 1.5}, prop={0.0: {'draft2': [0.05, 0.1]}}, s={0.0: {3: 0.05}})}
    row = _grid_row(('draft2', 3, 0.0, 1), raw[('draft2', 3, 0.0, 1)], raw, costs, fast=True)
    # 21 rounds of 3 tokens and the first token, which the prompt's pass emitted (at t_step in the target alone's time too)
    hand = (21 * 3 + 1) * 0.002 / (21 * (1.5 * 0.002 + (0.05 + 3 * 0.1 + 0.05) * 0.002 + 0.0003))     # 0.128 / 0.0861 = 1.4866...
    assert row['predicted_speedup'] == round(hand, 3) == 1.487, row
    assert row['alpha_per_position'] == [1.0, 1.0, 0.0] and row['tokens_per_round'] == 3.0 and row['identical'] is True
    assert row['host_per_round'] == 0.15 and row['loop_per_round'] == 0.15 and row['occupancy'] == 1.0 and row['speedup'] == round(640 / 320, 3)
    # the prompts' pass (2.1 ms, 0.1 ms a round) is in the host time the prediction prices, not in the loop's own per round
    st2 = dataclasses.replace(st, t_parts={**st.t_parts, 'prefill': 21 * 0.0001}, t_total=st.t_total + 21 * 0.0001)
    row2 = _grid_row(('draft2', 3, 0.0, 1), [(dict(res, stats=st2), 320.0, (base, base))], raw, costs, fast=True)
    assert row2['host_per_round'] == 0.2 and row2['loop_per_round'] == 0.15, row2
    # with the verify pass timed in the loop (rho = 1.2: 20% dearer than v(3) t1), the row prices it at v(3) rho t1
    costs[1]['rho'] = {0.0: {'draft2': 1.2}}
    row = _grid_row(('draft2', 3, 0.0, 1), raw[('draft2', 3, 0.0, 1)], raw, costs, fast=True)
    hand = (21 * 3 + 1) * 0.002 / (21 * (1.5 * 1.2 * 0.002 + (0.05 + 3 * 0.1 + 0.05) * 0.002 + 0.0003))   # 0.128 / 0.0987 = 1.2969...
    assert row['predicted_speedup'] == round(hand, 3) == 1.297 and row['verify_scale'] == 1.2, row

def test_heuristic_k_schedule(target, prompts, ref):
    "transformers' schedule, +2 after a round with every guess kept, -1 otherwise, between 1 and kmax."
    h = HeuristicK(kmax=8, k0=5)
    seen = []
    for n in (5, 7, 8, 3, 0, 0, 0, 0, 0, 0):
        k = h.choose(); seen.append(k); h.update(k, [n], [k])
    assert seen == [5, 7, 8, 8, 7, 6, 5, 4, 3, 2] and h.k == 1 and HeuristicK(4, 9).k == 4
    h = HeuristicK(8, 4); h.update(4, [4, 2], [4, 4]); assert h.k == 3, "one row short of a full round is not a full round"
    h = HeuristicK(8, 4); h.update(4, [4, 2], [4, 2]); assert h.k == 6, "a row given fewer guesses that kept them all is full"
    V = target.cfg.vocab_size
    for right, want in ((None, [5, 7, 8, 8]), (0, [5, 4, 3, 2, 1, 1])):      # in the loop, with proposers always right / never right
        out, st = speculative_generate(target, Oracle(ref, V, right), prompts[:1], 64, 8, k_policy=HeuristicK(8, 5))
        assert out == ref and st.k_used[:len(want)] == want, st.k_used
        assert st.alpha_per_position == ([1.0] * 8 if right is None else [0.0] + [None] * 7), "positions after a refusal are not reached"

def test_adaptive_k_untimed(target, prompts, ref):
    """AdaptiveK without a clock, v(k) = 1 + 0.2 k: a free proposer that is never right stops speculating once its
    acceptance estimate says no k pays, and probes once every probe_every rounds; one that is always right climbs to kmax."""
    V, v = target.cfg.vocab_size, (lambda k: 1 + 0.2 * k)
    pol = AdaptiveK(6, c=0.0, v=v, timed=False)
    assert pol.alphas() == [0.5] * 6 and pol.gains()[2] == pytest.approx(1.75 / 1.4, abs=1e-12)     # the prior, by hand
    out, st = speculative_generate(target, Oracle(ref, V, right=0), prompts[:1], 64, 6, k_policy=pol)
    assert out == ref
    # by hand: after n refusals at position 1 the estimate is (prior/2) / (prior + sum of decay^i, i < n); k = 1 pays while (1 + α)/v(1) >= 1
    n, seen = 0, 0.0
    while (1 + pol.prior * 0.5 / (seen + pol.prior)) / v(1) >= 1: n += 1; seen = seen * pol.decay + 1
    want = [1 if (i < n or (i + 1) % pol.probe_every == 0) else 0 for i in range(len(st.k_used))]
    assert n == 4 and st.k_used == want, st.k_used
    pol = AdaptiveK(6, c=0.0, v=v, timed=False)
    out, st = speculative_generate(target, Oracle(ref, V), prompts[:1], 64, 6, k_policy=pol)
    assert out == ref and st.alpha_per_position == [1.0] * 6
    assert st.k_used[3:] == [6] * (len(st.k_used) - 3) and len(st.k_used) > 6, st.k_used

def test_measure_v(target):
    "v(k) = t(k+1)/t(1), measured on the library's own pass timer (it once raised NameError)."
    m = measure_v(target, kmax=2, context=40, reps=3)
    assert set(m['v']) == {0, 1, 2} and m['v'][0] == 1.0 and m['t1'] > 0 and all(x > 0 for x in m['v'].values())

def test_verdict_says_what_paid():
    "The main job's last line: a fixed k that paid is named with its costs; an adaptive row whose policy decoded plainly is"
    "not called a gain (its ×1.04 is plain decoding's noise; a GPU run once printed 'draft4 with adaptive k (mean 0.0) paid most')."
    from smallem_spec.bench import verdict
    row = lambda p, k, T, s, mk=None: dict(proposer=p, k=k, temperature=T, batch=1, speedup=s, mean_k=mk, c=0.3, alpha_per_position=[0.8])
    res = {'meta': {'gpu': None, 'cpu': 'Some CPU', 'costs': {'1': {'v': {'2': 1.1, '3': 1.2}, 'c': {'draft2': 0.3, 'mtp': 0.2}}}},
           'rows': [row('none', 0, 0.0, 1.0), row('mtp', 2, 0.0, 1.5), row('draft2', 'adaptive', 0.0, 0.97, 0.2),
                    row('mtp', 2, 1.0, 0.9), row('draft2', 'adaptive', 1.0, 1.04, 0.0)]}
    v = verdict(res)
    assert v.startswith('Verdict on Some CPU, batch 1: greedy: mtp k=2 paid most, x1.50 (a verify pass over 3 tokens costs 1.10'), v
    assert 'T=1: nothing paid (best draft2 adaptive x1.04, but its policy decoded plainly: mean k 0.0)' in v, v
    assert 'slower than the target alone at every k: draft2' in v, v
    assert 'noise' not in v, v                                     # no baseline spread recorded (older results): no noise clause

def test_verdict_knows_the_runs_noise():
    "When the target alone's runs around a group differ by 12%, a ×1.08 is not called a gain and the line says why; where each"
    "row was timed between two runs 5% apart (`pair_spread`), its ×1.08 is over that noise and named."
    from smallem_spec.bench import verdict
    row = lambda p, k, T, s, mk=None: dict(proposer=p, k=k, temperature=T, batch=1, speedup=s, mean_k=mk, c=0.3, alpha_per_position=[0.8])
    res = {'meta': {'gpu': None, 'cpu': 'Some CPU', 'costs': {'1': {'v': {'2': 1.1, '3': 1.2}, 'c': {'mtp': 0.2}}}},
           'rows': [dict(row('none', 0, 0.0, 1.0), baseline_spread=0.12), row('mtp', 2, 0.0, 1.08), row('mtp', 3, 0.0, 1.2)]}
    v = verdict(res)
    assert 'greedy: mtp k=3 paid most, x1.20' in v, v              # beyond the 12% it is still named
    res['rows'].pop()
    v = verdict(res)
    assert 'greedy: nothing paid (best mtp k=2 x1.08)' in v and 'moved by up to 12%' in v, v
    # rows priced over the two runs just around each (`pair_spread`, 5% apart here): the x1.08 is beyond that noise and named
    res['rows'][1] = dict(res['rows'][1], pair_spread=0.05)
    v = verdict(res)
    assert 'greedy: mtp k=2 paid most, x1.08' in v and 'moved by up to 12%' in v and 'differed by a median of 5% (greedy)' in v, v

def test_baseline_spread_pairs_the_runs_around_each_group():
    "The target alone's row: the largest gap between the run before and the run after one group (each run closes one"
    "group and opens the next), over the repeats; never between the last run of one repeat and the first of the next."
    from smallem_spec.bench import _grid_row
    run = lambda tps: {'tokens': tps, 'seconds': 1.0, 'stats': None}
    a, b, c, d, e = run(100.), run(110.), run(111.), run(200.), run(202.)
    lst = [(a, None, None), (b, None, a), (c, None, b), (d, None, None), (e, None, d)]   # two repeats: two groups, then one
    row = _grid_row(('none', 0, 0.0, 1), lst, {}, {}, True)
    assert row['baseline_spread'] == pytest.approx(0.095, abs=1e-3) and row['speedup'] == 1.0   # 100 -> 110; not 111 -> 200

def test_grid_row_prices_each_row_with_the_plain_steps_around_its_group():
    "Two repeats of a row whose groups ran between plain steps of 4 ms and of 2 ms (the machine sped up in between):"
    "each repeat's speed-up is over the two runs around its own group, and each repeat's prediction takes its plain step"
    "from that pair too, so both repeats are measured/predicted = 1; pairing a repeat with the other's runs would give 2 or 1/2."
    from smallem_spec.bench import _grid_row
    from smallem_spec.spec import SpecStats
    st = SpecStats.from_log([(2, [2], [1])] * 10, 2, [[0] * 20], {'propose': 0.0, 'verify': 0.0, 'decide': 0.0, 'keep': 0.0, 'accept': 0.0, 'bookkeeping': 0.0}, 0.0, ['max_new_tokens'])
    plain = lambda ms: dict(seconds=ms * 1e-3 * 20, passes=20, tokens=20, texts=[[0] * 20], row_slots=0, stats=None)
    slow, fast_ = (plain(4), plain(4)), (plain(2), plain(2))
    res = dict(seconds=0.02, tokens=20, texts=[[0] * 20], row_slots=10, stats=st, chunks=0)   # every token from the rounds: no prompt's pass emitted one
    raw = {('none', 0, 0.0, 1): [(slow[0], None, None), (slow[1], None, slow[0]), (fast_[0], None, None), (fast_[1], None, fast_[0])],
           ('mtp', 2, 0.0, 1): [(res, 250.0, slow), (res, 500.0, fast_)]}
    costs = {1: dict(t1=0.002, v={2: 1.0}, prop={0.0: {'mtp': [0.0, 0.0]}}, s={0.0: {2: 0.0}}, rho={0.0: {'mtp': 1.0}})}
    row = _grid_row(('mtp', 2, 0.0, 1), raw[('mtp', 2, 0.0, 1)], raw, costs, fast=True)
    assert row['speedup'] == 3.0                     # 1000 tok/s over 250 and over 500: 4 and 2, their median 3
    # repeat 1: 2 tokens a round, 4 ms steps, a round priced v(2) t1 = 2 ms: 4x; repeat 2: 2 ms steps: 2x; the median repeat's terms
    assert sorted([row['predicted_speedup'], row['t_step_ms']]) in ([2.0, 2.0], [4.0, 4.0]) and row['measured_over_predicted'] == 1.0
    assert row['pair_spread'] == 0.0                 # the two runs around each repeat ran at the same speed

def _simulate_timed(monkeypatch, alpha:float, round_cost_of, texts:int=8, tokens:int=200, seed:int=0, catchup:float=0.0,
                    policy=AdaptiveK, calls:bool=False, phase=None, verify=None, overhead:float=0.0, untimed:int=0, **kw) -> float:
    "Drive AdaptiveK's timed path with a simulated clock: a plain step costs 1, a round at k costs round_cost_of(k) (plus"
    "`catchup` for the first round of a text or after plain steps: the proposer reading what it missed) and keeps each"
    "guess with probability alpha until the first refusal. `calls`: as the fused loop of 12a_fused_cpu, a choice's"
    "`steps` rounds run in one call, each reported with its own seconds. `phase`: the host's speed, a factor on every"
    "cost as a function of the clock; `verify`: k -> the plain steps of a round's verify pass, reported with each round"
    "(times the phase) as the fused loop reports its verify passes; `overhead`: plain steps each round costs beyond the"
    "seconds it is reported with (the interpreter around the rounds, the choices and reports), on the clock before its"
    "report. `untimed`: that many texts first, left out of the result (a policy that has decoded other texts before). Returns"
    "the time per token over plain decoding's at the same phases (plain decoding's own time, step by step)."
    import random, smallem_spec.cost as cost_mod
    now = [0.0]; monkeypatch.setattr(cost_mod.time, 'perf_counter', lambda: now[0])
    f = phase or (lambda t: 1.0)
    assert not (untimed and phase), "untimed texts with a phase: plain decoding's clock would not start where the counted texts do"
    rng, pol, spent, made = random.Random(seed), policy(6, 0.3, lambda j: 1.0, **kw), 0.0, 0
    for i in range(texts + untimed):
        if i == untimed: start = now[0]   # the texts that count begin
        pol.start(); left, prev = tokens, 0
        while left > 0:
            k = pol.choose()
            if k == 0:
                m = max(1, min(pol.steps, left))
                for _ in range(m): now[0] += f(now[0])
                pol.update(0, [], [], steps=m); left -= m; prev = 0; continue
            for j in range(pol.steps if calls else 1):
                if j and left <= 1: break
                kk, n = min(k, max(left - 1, 0)) if calls else k, 0
                while n < kk and rng.random() < alpha: n += 1
                x = f(now[0]); dt = (round_cost_of(k) + (catchup if prev == 0 else 0.0)) * x; now[0] += dt + overhead * x
                vf = {'verify': verify(k) * x} if verify else {}
                if calls: pol.update(k, [n], [kk], seconds=dt, more=j > 0, **vf)
                else: pol.update(k, [n], [k], **vf)
                left -= n + 1; prev = k
        made += tokens if i >= untimed else 0
    spent = now[0] - start
    if phase is None: return spent / made
    plain, t = 0.0, 0.0   # plain decoding over the same clock: every token one step at the host's speed of its moment
    for _ in range(made): x = f(t); t += x; plain += x
    return spent / plain

_dear = lambda k: 1.4 + 0.8 * k      # rounds that cost more than they return at α = 1/2 (about draft2's at batch 8 on the H200)
_cheap = lambda k: 1.05 + 0.1 * k    # rounds that pay at α = 0.8

def _mean_timed(monkeypatch, **kw) -> float:
    "`_simulate_timed` over 5 seeds, their mean (deterministic)."
    import statistics
    return statistics.mean(_simulate_timed(monkeypatch, seed=s, **kw) for s in range(5))

def test_adaptive_never_much_slower_than_plain(monkeypatch):
    "A proposer whose rounds cost more than they return (a round at k costs 1.4 + 0.8 k plain steps, about what draft2's"
    "rounds cost at batch 8 on the H200, and keeps each guess with probability 1/2), over one text of 200 tokens (batch 8"
    "on 8 prompts: one text) and over 8 texts (batch 1). Mean of 5 seeded runs; deterministic. The policy's first probe"
    "is the floor it cannot go under (about 3% of 200 tokens); without the probe floor (probe_share=1: stretches grow"
    "only by doubling) one text loses about 14%, what made the GPU's batch-8 adaptive rows 0.70-0.89 of plain decoding."
    mean = lambda **kw: _mean_timed(monkeypatch, **kw)
    assert mean(alpha=0.5, round_cost_of=_dear, texts=1) <= 1.06
    assert mean(alpha=0.5, round_cost_of=_dear, texts=8) <= 1.04
    assert mean(alpha=0.5, round_cost_of=_dear, texts=1, probe_share=1.0, budget=0.0) > 1.10      # the control: the old schedule (and no loss budget)
    # where speculation pays (cheap rounds, acceptance 0.8) the policy still takes it
    assert mean(alpha=0.8, round_cost_of=_cheap, texts=1) < 0.6

def test_adaptive_policy_that_has_decoded_other_texts_keeps_a_short_row_at_plain_speed(monkeypatch):
    "The README's job runs 4 texts of 100 tokens a row. A losing proposer (rounds of 1.4 + 0.8 k plain steps, α = 1/2, a"
    "catch-up of 6 steps after plain ones) costs a fresh policy its first probe, 3% of such a row; the same policy after 4"
    "other texts of 100 tokens (what `smallem_bench` has each adaptive row's policy decode first, untimed: `run_config(prime=)`)"
    "stays within 0.5% of plain decoding. The control is the fresh policy; where speculation pays (α = 0.8, cheap rounds)"
    "the policy that has decoded other texts keeps at least the fresh one's gain. Mean of 5 seeded runs; deterministic."
    losing, paying = dict(alpha=0.5, round_cost_of=_dear, catchup=6.0, texts=4, tokens=100), dict(alpha=0.8, round_cost_of=_cheap, texts=4, tokens=100)
    fresh, primed = _mean_timed(monkeypatch, **losing), _mean_timed(monkeypatch, untimed=4, **losing)
    assert primed <= 1.005 and fresh > primed + 0.02, (fresh, primed)
    assert _mean_timed(monkeypatch, untimed=4, **paying) <= _mean_timed(monkeypatch, **paying) < 0.6

def test_run_config_primes_an_adaptive_policy_on_other_texts_untimed(monkeypatch):
    "`run_config(prime=)`: an adaptive row's policy first decodes the held-out prompts, a chunk of the row's batch at a time,"
    "and the row then runs with that same policy; the priming's time and tokens are not the row's (each priming call is"
    "made to last 50 ms here, the row's calls nothing). A fixed-k row ignores `prime`."
    import time, smallem_spec.bench as bench
    from smallem_spec.spec import SpecStats, PARTS
    calls = []
    def fake_spec(target, proposer, prompts, n, k, T, g, k_policy=None):
        calls.append((prompts, k_policy))
        if prompts[0][0] >= 100: time.sleep(0.05)   # a held-out prompt
        out = [[1] * n for _ in prompts]
        return out, SpecStats.from_log([(1, [1] * len(prompts), [0] * len(prompts))] * n, 1, out, dict.fromkeys(PARTS, 0.0), 0.0, ['max_new_tokens'] * len(prompts))
    monkeypatch.setattr(bench, 'speculative_generate', fake_spec); monkeypatch.setattr(bench, 'make_proposer', lambda *a, **kw: None)
    class T: device = torch.device('cpu')
    costs = dict(t1=1e-3, v={j: 1.0 for j in range(7)}, prop={0.0: {'draft2': [0.0, 0.3]}}, s={0.0: {j: 0.0 for j in range(1, 7)}}, t_step={0.0: 1e-3})
    rows, held = [[1, 2], [3, 4], [5, 6], [7, 8]], [[100], [101], [102], [103]]
    res = bench.run_config(T(), {}, rows, 5, 'draft2', 'adaptive', 0.0, 2, costs, prime=held)
    assert [c[0] for c in calls] == [held[:2], held[2:], rows[:2], rows[2:]]
    assert all(isinstance(c[1], AdaptiveK) and c[1] is calls[0][1] for c in calls)   # one policy: primed, then the row's
    assert res['tokens'] == 20 and res['seconds'] < 0.05
    calls.clear(); bench.run_config(T(), {}, rows, 5, 'draft2', 2, 0.0, 2, costs, prime=held)
    assert [c[0] for c in calls] == [rows[:2], rows[2:]] and calls[0][1] is None

def test_adaptive_probe_counts_the_catch_up(monkeypatch):
    "A losing proposer (rounds of 1.4 + 0.8 k plain steps, α = 1/2) whose first round after plain steps also pays a"
    "catch-up of 6 plain steps (what draft4's first round cost on an AMD EPYC, 7-8 steps against 2.5-3 for the others),"
    "8 texts of 200 tokens: the policy measures the catch-up and spaces its probes by it, within 5% of plain decoding;"
    "the control, the same policy blind to the catch-up, probes as if it were free and loses more. Mean of 5 seeded runs,"
    "without the loss budget (test_adaptive_loss_budget), which would hide what the probe's own spacing does."
    class Blind(AdaptiveK):
        def update(self, *a, **kw): super().update(*a, **kw); self.catchup = 0.0
    mean = lambda **kw: _mean_timed(monkeypatch, alpha=0.5, round_cost_of=_dear, catchup=6.0, budget=0.0, **kw)
    seen, blind = mean(), mean(policy=Blind)
    assert seen <= 1.05 and blind > seen + 0.01, (seen, blind)

def test_adaptive_loss_budget(monkeypatch):
    "A losing proposer (rounds of 1.4 + 0.8 k plain steps, α = 1/2, a catch-up of 6 steps after plain ones), 8 texts of 200"
    "tokens: the policy keeps what its timed rounds lost beyond what they returned, and past 1% of the tokens so far it"
    "holds plain steps until they have made it up, so it stays within 2% of plain decoding; the control without that"
    "ledger (budget 0) loses over 3.5%. Where speculation pays, the ledger changes nothing. Mean of 5 seeded runs."
    mean = lambda **kw: _mean_timed(monkeypatch, **kw)
    kept, control = mean(alpha=0.5, round_cost_of=_dear, catchup=6.0), mean(alpha=0.5, round_cost_of=_dear, catchup=6.0, budget=0.0)
    assert kept <= 1.02 and control > 1.035, (kept, control)
    assert mean(alpha=0.8, round_cost_of=_cheap, texts=1) == mean(alpha=0.8, round_cost_of=_cheap, texts=1, budget=0.0)

def test_adaptive_counts_the_time_its_rounds_are_not_reported_with(monkeypatch):
    "A proposer whose rounds pay a little by their own seconds (1.2 + 0.38 k plain steps, α = 0.65: k = 2 x1.06) but cost"
    "0.15 plain steps more each on the wall clock (the interpreter between calls, the policy's choices and reports: about"
    "what a trace of draft2 with its draft vocabulary at T = 1 on the AMD EPYC without AVX-512 showed outside the rounds'"
    "seconds, some 35 ms a row of 8 texts and 700-900 rounds),"
    "a catch-up of 2 steps, 8 texts of 200 tokens, mean of 8 seeds, rounds in calls as the fused loop runs them (one by"
    "one, as in the loop of 05_greedy, a round's seconds come from the loop's clock and hold that time). The policy prices each"
    "round with its share of what its call's seconds missed and keeps its ledger by the wall clock, so it stays within 2% of"
    "plain decoding (1.4%); the control that knows only the reported seconds (the ledger and prices of before) speculates and"
    "loses over 2% (2.4%; 3.2% before a k not yet timed and priced to lose ran only a probe's length). Where the seconds are the whole cost, the two are the same but for rounding (a difference of clock readings is not the sum"
    "of the seconds to the last bit, and a threshold may fall the other way once in a run)."
    import statistics
    class SecondsOnly(AdaptiveK):
        def update(self, *a, **kw): super().update(*a, **kw); self._tw = None   # no wall clock: each report owns only its seconds
    cost = lambda k: 1.2 + 0.38 * k
    run = lambda policy, calls, overhead: statistics.mean(_simulate_timed(monkeypatch, alpha=0.65, round_cost_of=cost, catchup=2.0, seed=s,
                                                                           calls=calls, overhead=overhead, policy=policy) for s in range(8))
    walled, control = run(AdaptiveK, True, 0.15), run(SecondsOnly, True, 0.15)
    assert walled <= 1.02 and control > 1.02, (walled, control)
    assert abs(run(AdaptiveK, True, 0.0) - run(SecondsOnly, True, 0.0)) < 0.002   # (the wall clock's differences round apart from the seconds)
    # by hand: a call of two rounds reported with 1.5 s each, 4 s on the wall clock since the last report, plain steps of 1 s:
    # the ledger takes the 4 s against the 4 tokens (no loss, no gain), the rounds' prices their 1.5 s, and the next choice
    # learns that each round of that call cost 0.5 s more than it was reported with, which prices the rounds after it
    import smallem_spec.cost as cost_mod
    now = [0.0]; monkeypatch.setattr(cost_mod.time, 'perf_counter', lambda: now[0])
    pol = AdaptiveK(6, 0.5, lambda j: 1.0); pol.start(); pol.t_plain, pol._prev, pol._t0 = 1.0, 2, 0.0
    now[0] = 4.0; pol.update(2, [1], [2], seconds=1.5); pol.update(2, [1], [2], seconds=1.5, more=True)
    assert pol.ledger == 0.0 and pol.costs[2] == 1.5 and pol.over == 0.0
    pol.choose(); now[0] += 1.5; pol.update(2, [1], [2], seconds=1.5)
    assert pol.over == 0.5 and pol._ts[2][-1] == 2.0

def test_adaptive_a_dear_first_round_does_not_stop_a_proposer_that_pays(monkeypatch):
    "A proposer that pays well (rounds of 1.05 + 0.1 k plain steps, α = 0.8) whose first round of each text and after plain"
    "steps pays a catch-up of 15 plain steps (a long prompt read), 4 texts, mean of 5 seeds, rounds in calls and one by one:"
    "the ledger takes each catch-up, and the gains of the rounds after it pay it back; the loss budget bounds only the hope"
    "of a proposer whose estimates do not pay, so the policy keeps speculating (0.68 of plain decoding's time). A version"
    "that went to plain steps whenever the ledger was over its budget, whatever the estimates said (tried in this form),"
    "took the catch-up for a loss to be made up and ran 0.74 in calls and 1.02 one by one."
    import statistics
    for calls in (True, False):
        t = statistics.mean(_simulate_timed(monkeypatch, alpha=0.8, round_cost_of=_cheap, catchup=15.0, seed=s, calls=calls, texts=4) for s in range(5))
        assert t < 0.70, (calls, t)

def test_adaptive_never_tries_a_hopeless_proposer(monkeypatch):
    "Priced beforehand at c = 0.7 a guess and v(k) = 1.5 (about draft4's at T = 1 on an AMD EPYC), no k pays even if 9"
    "guesses in 10 were kept: the policy never speculates and costs exactly plain decoding, though the proposer's rounds"
    "(1.4 + 0.8 k plain steps, α = 1/2) lose; the control that hopes for every guess kept (hope = 1, where k = 6 would"
    "pay) probes and loses."
    class Dear(AdaptiveK):
        def __init__(self, kmax, c, v, **kw): super().__init__(kmax, 0.7, lambda j: 1.5, **kw)
    assert _simulate_timed(monkeypatch, alpha=0.5, round_cost_of=_dear, policy=Dear) == 1.0
    assert _simulate_timed(monkeypatch, alpha=0.5, round_cost_of=_dear, policy=Dear, hope=1.0) > 1.005

def test_adaptive_plain_unit_ignores_a_stall(monkeypatch):
    "The plain step every cost is priced in is the median of the last nine timed stretches: one stretch the machine stalled"
    "in (ten times slower) leaves it at 1; a decayed mean (0.75/0.25) would have put it at 3.25, every round then looking a"
    "third of its cost."
    import smallem_spec.cost as cost_mod
    now = [0.0]; monkeypatch.setattr(cost_mod.time, 'perf_counter', lambda: now[0])
    pol = AdaptiveK(6, 0.3, lambda j: 1.0)
    for per_step in (1.0, 1.0, 10.0):
        pol._t0 = now[0]; now[0] += 8 * per_step; pol.update(0, [], [], steps=8)
    assert pol.t_plain == 1.0

def test_adaptive_plain_unit_skips_the_cold_steps(monkeypatch):
    "The first plain steps after speculative rounds read weights the proposer pushed out of cache (on an AMD EPYC the first"
    "cost a fifth to two thirds more than the steady ones, by proposer, and the next three less and less). Stretches of 8 steps whose first 4 cost 1.5 each and the rest 1: the unit"
    "is 1 (timing whole stretches, as before, gave 1.25, every round then looking a fifth cheaper than it is), and what the"
    "cold steps paid beyond it (2 plain steps) is kept as part of a probe's cost; a stretch after plain steps teaches no"
    "switching cost."
    import smallem_spec.cost as cost_mod
    now = [0.0]; monkeypatch.setattr(cost_mod.time, 'perf_counter', lambda: now[0])
    pol = AdaptiveK(6, 0.3, lambda j: 1.0)
    for prev in (2, 2, 2):
        pol._prev, pol._t0 = prev, now[0]; now[0] += 4 * 1.5 + 4 * 1.0; pol.update(0, [], [], steps=8, first=(4, 4 * 1.5))
    assert pol.t_plain == 1.0 and pol.switch == 2.0, (pol.t_plain, pol.switch)
    whole = AdaptiveK(6, 0.3, lambda j: 1.0)
    whole._t0 = now[0]; now[0] += 10.0; whole.update(0, [], [], steps=8)
    assert whole.t_plain == 1.25 and whole.switch == 0.0

def _stalled(base, n:int, factor:float):
    "A round cost whose first n rounds are `factor` times dearer: the machine busy elsewhere while the first probe runs."
    count = [0]
    def f(k): count[0] += 1; return base(k) * (factor if count[0] <= n else 1.0)
    return f

def test_adaptive_probe_in_a_bad_moment(monkeypatch):
    "A proposer that pays (rounds of 1.2 + 0.35 k plain steps, α = 0.75, a catch-up of 1 step: about the MTP module's at"
    "T = 1 on an AMD EPYC, x1.2 at k = 2) whose first four rounds fall in a stall (twice their cost: the machine is shared),"
    "8 texts of 200 tokens, mean of 8 seeds: the policy stops speculating only when even an acceptance one standard error"
    "above its estimate would not pay (z = 1), so a stalled probe and a few unlucky guesses do not send it to plain steps,"
    "and it ends under 0.90 of plain decoding's time; the control that stops on its estimates alone (z = 0) spends much of"
    "the run in plain steps (over 0.95). Without the stall both take what speculation offers (under 0.88)."
    import statistics
    pays = lambda k: 1.2 + 0.35 * k
    run = lambda cost, **kw: statistics.mean(_simulate_timed(monkeypatch, alpha=0.75, round_cost_of=cost(), catchup=1.0, seed=s, **kw) for s in range(8))
    hoped, control = run(lambda: _stalled(pays, 4, 2.0)), run(lambda: _stalled(pays, 4, 2.0), z=0.0)
    assert hoped < 0.90 and control > 0.95, (hoped, control)
    assert run(lambda: pays) < 0.88 and run(lambda: pays, z=0.0) < 0.88

def test_adaptive_prices_by_hand(monkeypatch):
    "c and v priced in passes of `unit` seconds become plain steps once a plain step is timed (here 2 units a step); a k"
    "timed n times is its median weighed against that price (plus the offset its rounds showed) as n0 = 3 more rounds."
    import smallem_spec.cost as cost_mod
    now = [0.0]; monkeypatch.setattr(cost_mod.time, 'perf_counter', lambda: now[0])
    pol = AdaptiveK(6, 0.5, lambda j: 1.0, unit=1.0)
    assert pol.cost(2) == 2.0                                    # k c + v(k) in units: no plain step timed yet
    pol._t0 = now[0]; now[0] += 40.0; pol.update(0, [], [], steps=20)   # plain steps of 2 seconds: a unit is half a step
    assert pol.t_plain == 2.0 and pol.cost(2) == 1.0 and pol.cost(4) == 1.5
    pol._prev = 2
    for _ in range(3): pol.update(2, [1], [2], seconds=4.0)    # three rounds at k = 2, each 2 plain steps: 1 more than priced
    assert pol.host == 1.0 and pol.costs[2] == 2.0
    assert pol.cost(2) == (3 * 2.0 + 3 * (1.0 + 1.0)) / 6       # its median against the price with the offset
    assert pol.cost(4) == 1.5 + 1.0                             # a k not run: the price and the offset the others showed

def test_adaptive_retimes_plain_steps_when_rounds_come_in_calls(monkeypatch):
    "Where the loop runs a choice's rounds in one call (12a_fused_cpu: `ahead` rounds, each reported with more=True), the"
    "choices fall on rounds 1, 33, 65, ...: the plain steps are still re-timed on schedule (a count since the last timing;"
    "`rounds % plain_every == 0` would never hold there). The schedule: the first timing before any round, the next after"
    "`plain_every` = 128 rounds, each later one after twice as many as the one before, up to `plain_most` = 8 times 128"
    "(about 4% of an MTP row went to those stretches of 20 plain steps every 128 rounds in a trace on the Intel Xeon)."
    "With plain_most = 1, every 128 rounds as before. A proposer that pays, 4,096 rounds."
    import smallem_spec.cost as cost_mod
    now = [0.0]; monkeypatch.setattr(cost_mod.time, 'perf_counter', lambda: now[0])
    def timed_at(**kw):
        pol, at, rounds = AdaptiveK(6, 0.05, lambda j: 1.0, probe_rounds=1, **kw), [], 0
        while rounds < 4096:
            k = pol.choose()
            if k == 0:
                if pol._timing: at.append(rounds)
                now[0] += pol.steps; pol.update(0, [], [], steps=pol.steps); continue
            for j in range(pol.steps):   # every guess kept: each round costs 1 + 0.05 k steps and returns k + 1 tokens
                pol.update(k, [k], [k], seconds=1.0 + 0.05 * k, more=j > 0); rounds += 1
        assert pol.ahead == 32
        return at
    at = timed_at(); gaps = [b - a for a, b in zip(at, at[1:])]
    assert at[0] == 0 and len(gaps) >= 5 and all(g == 1024 for g in gaps[3:]), at                 # 1,024 rounds apart in the end
    assert [(128 * 2 ** i) // 32 * 32 <= g <= 128 * 2 ** i + 32 for i, g in enumerate(gaps[:4])] == [True] * 4, gaps   # 128, 256, 512, 1024 (calls of 32 rounds)
    every = timed_at(plain_most=1)
    assert 4096 // 128 - 1 <= len(every) <= 4096 // 128 + 1, every                               # the control: every 128 rounds

def _draft4_like(monkeypatch, catchup:float=1.0, **kw) -> float:
    "A drafter like draft4 on the AMD EPYC: rounds of 1.6 + 0.5 k plain steps, α = 0.78 (every k loses: x0.85-0.92),"
    "priced beforehand 8% under that (0.42 a guess, v(k) = 1.1 + 0.09 k: k = 2 looks like x1.12), run as the fused loop runs"
    "a choice, its rounds in one call; 8 texts of 200 tokens, mean of 8 seeds (deterministic)."
    import statistics
    d4 = lambda k: 1.6 + 0.5 * k
    return statistics.mean(_simulate_timed(monkeypatch, alpha=0.78, round_cost_of=d4, catchup=catchup, seed=s, calls=True,
                           policy=lambda kmax, c, v, **k2: AdaptiveK(kmax, 0.46 * 0.92, lambda j: (1.2 + 0.1 * j) * 0.92, **k2), **kw) for s in range(8))

def test_adaptive_lets_a_marginal_loser_go_once_timed(monkeypatch):
    "The draft4-like drafter of `_draft4_like`. The z = 1 hope is for thin evidence: once the best k has been timed in 64"
    "rounds the estimates alone decide, and the hope is bounded by the loss budget (next test), so the policy stays within"
    "2.5% of plain decoding (1.9% here); the control that hopes forever and unbounded (as before both bounds) keeps"
    "speculating and loses more (2.9%; 4.6% before a k not yet timed and priced to lose ran only a probe's length)."
    import math
    hoped_once, hoped_always = _draft4_like(monkeypatch), _draft4_like(monkeypatch, z_rounds=10**9, hope_loss=math.inf)
    assert hoped_once <= 1.025 and hoped_always > hoped_once + 0.008, (hoped_once, hoped_always)

def test_adaptive_hope_is_bounded_by_the_loss_budget(monkeypatch):
    "The draft4-like drafter of `_draft4_like` with a catch-up of 6 plain steps after plain ones (what draft4's first round"
    "paid in a trace on the AMD EPYC, where its hope ran three calls of 32 rounds that lost 55 plain steps in all before the"
    "estimates let it go). While only the hope speculates (the estimate of the best k does not pay), the policy stops"
    "once its timed rounds have lost more than the budget allows plus two probes' worth (`hope_loss` = 2): 1.9% slower"
    "than plain decoding (1.0189) against 2.6% (1.0258) without the bound; with a hope that never expires (z_rounds huge)"
    "the bound alone keeps it at 1.9%, against 3.8% without it (before a k not yet timed and priced to lose ran only a"
    "probe's length: 2.2% against 3.1%, and 2.2% against 5.9%). (A bound of one probe did better here, 1.4%, but sent the"
    "stalled probe of `test_adaptive_probe_in_a_bad_moment` to plain steps.)"
    import math
    bound, unbound = _draft4_like(monkeypatch, catchup=6.0), _draft4_like(monkeypatch, catchup=6.0, hope_loss=math.inf)
    assert bound <= 1.022 and unbound > bound + 0.005, (bound, unbound)
    forever, forever_unbound = (_draft4_like(monkeypatch, catchup=6.0, z_rounds=10**9, **kw) for kw in ({}, dict(hope_loss=math.inf)))
    assert forever <= 1.022 and forever_unbound > 1.035, (forever, forever_unbound)

def test_grid_row_prices_plain_steps_without_the_prompts_pass():
    "An adaptive row whose policy decoded plainly, exactly as fast as the target alone: one text of 20 tokens, a prompt's"
    "pass of 4 ms that emits the first token, then 19 plain steps of 2 ms, in both runs. The row's host time is its"
    "prompt's pass, so its plain steps are priced without it (`_plain_step`: 2 ms, not 42 / 20 = 2.1) and the first"
    "token counts at the target alone's time a token: predicted x1.000, measured/predicted 1. The control, the"
    "prediction of before (plain steps at 2.1 ms plus the host, no first token), says x0.909 of a row that lost nothing."
    from smallem_spec.bench import _grid_row, _predict, _plain_step
    from smallem_spec.spec import SpecStats, PARTS
    tp = {**dict.fromkeys(PARTS, 0.0), 'prefill': 0.004, 'verify': 19 * 0.002}
    st = SpecStats.from_log([(0, [0], [0])] * 19, 6, [[0] * 20], tp, 0.042, ['max_new_tokens'])
    base = dict(seconds=0.042, passes=20, tokens=20, texts=[[0] * 20], row_slots=0, stats=None, prefill=0.004, prefills=1)
    assert _plain_step(base) == pytest.approx(0.002, rel=1e-12)
    res = dict(seconds=0.042, tokens=20, texts=[[0] * 20], row_slots=19, stats=st)
    raw = {('none', 0, 0.0, 1): [(base, None, None), (base, None, base)], ('mtp', 'adaptive', 0.0, 1): [(res, 20 / 0.042, (base, base))]}
    costs = {1: dict(t1=0.002, v={j: 1.0 for j in range(7)}, prop={0.0: {'mtp': [0.0, 0.0]}}, s={0.0: {j: 0.0 for j in range(1, 7)}}, rho={0.0: {'mtp': 1.0}})}
    row = _grid_row(('mtp', 'adaptive', 0.0, 1), raw[('mtp', 'adaptive', 0.0, 1)], raw, costs, fast=True)
    assert row['speedup'] == 1.0 and row['predicted_speedup'] == 1.0 and row['measured_over_predicted'] == 1.0, row
    assert row['loop_per_round'] == 0.0 and row['mean_k'] == 0
    old = _predict([], st.k_used, 0.0, costs[1]['v'], 0.042 / 20, st.t_host / st.rounds)
    assert old == pytest.approx(19 * 0.0021 / 0.0439, rel=1e-9) and old < 0.91

def test_grid_row_counts_one_prompt_pass_a_chunk_at_batch_2():
    "The same at batch 2 with three texts, so that the second chunk is part full: each chunk's prompts' pass (4 ms)"
    " emits one token a row, then 19 plain steps of 2 ms each, two rows in the first chunk and one in the second, in the"
    " row and in the target alone alike. Its first tokens are one step of the batch a chunk (two, `chunks`), and the"
    " prediction is x1.000; counted one a text (three), or with the part-full chunk dropped (one), it is not."
    from smallem_spec.bench import _grid_row, _plain_step
    from smallem_spec.spec import SpecStats, PARTS
    tp = {**dict.fromkeys(PARTS, 0.0), 'prefill': 0.004, 'verify': 19 * 0.002}
    st = (SpecStats.from_log([(0, [0, 0], [0, 0])] * 19, 6, [[0] * 20] * 2, tp, 0.042, ['max_new_tokens'] * 2)
          + SpecStats.from_log([(0, [0], [0])] * 19, 6, [[0] * 20], tp, 0.042, ['max_new_tokens']))
    base = dict(seconds=0.084, passes=40, tokens=60, texts=[[0] * 20] * 3, row_slots=0, stats=None, prefill=0.008, prefills=2, chunks=2)
    assert _plain_step(base) == pytest.approx(0.002, rel=1e-12)
    costs = {2: dict(t1=0.002, v={j: 1.0 for j in range(7)}, prop={0.0: {'mtp': [0.0, 0.0]}}, s={0.0: {j: 0.0 for j in range(1, 7)}}, rho={0.0: {'mtp': 1.0}})}
    def pred(chunks):
        res = dict(seconds=0.084, tokens=60, texts=[[0] * 20] * 3, row_slots=57, stats=st, chunks=chunks)
        raw = {('none', 0, 0.0, 2): [(base, None, None), (base, None, base)], ('mtp', 'adaptive', 0.0, 2): [(res, 60 / 0.084, (base, base))]}
        return _grid_row(('mtp', 'adaptive', 0.0, 2), raw[('mtp', 'adaptive', 0.0, 2)], raw, costs, fast=True)
    row = pred(2)
    assert row['speedup'] == 1.0 and row['predicted_speedup'] == pytest.approx(1.0, abs=1e-3) and row['measured_over_predicted'] == pytest.approx(1.0, abs=1e-3), row
    assert abs(pred(3)['predicted_speedup'] - 1.0) > 0.01 and abs(pred(1)['predicted_speedup'] - 1.0) > 0.01

def test_adaptive_rows_start_from_the_costs_timed_before_their_group():
    "An adaptive row's policy starts from the costs timed just before its group (the passes, the proposer's call, the"
    "target alone's plain step), not from those `measure_costs` took before the grid: in a run on the AMD EPYC without"
    "AVX-512 those had c(mtp) 0.33, its verify pass 25% dearer than v(1) t(1) and a plain step 0.84 t(1), which priced a"
    "k = 1 round at 2.2 plain steps, so every MTP adaptive row decoded plainly while k = 1 paid x1.12 beside it. By hand:"
    "passes of 4 / 5 / 6 ms over 1 / 2 / 3 tokens, guesses of 0.4 ms (c = 0.1), verify passes as timed alone at k = 1 and"
    "1.5 times dearer at kmax = 2, a plain step of 3.8 ms once the prompt's 4 ms pass of the 20 are left out. Other"
    "proposers and temperatures keep the grid's costs, and without the timings the grid's costs are used as they are."
    from smallem_spec.bench import _costs_now, _rho
    cst = dict(t1=0.002, v={0: 1.0, 1: 1.0, 2: 1.0}, kmax=2, prop={0.0: {'mtp': [0.0, 0.5], 'draft2': [0.0, 0.3]}}, t_step={0.0: 0.0017},
               rho_k={0.0: {'mtp': {1: 1.25, 2: 1.25}}}, s={0.0: {1: 0.0, 2: 0.0}})
    run = dict(seconds=0.004 + 19 * 0.0038, passes=20, prefill=0.004, prefills=1)
    now = _costs_now(cst, 0.0, 'mtp', {1: 4e-3, 2: 5e-3, 3: 6e-3}, (0.0, 4e-4, {1: 5e-3, 2: 9e-3}), run)
    assert now['t1'] == 4e-3 and now['v'] == {0: 1.0, 1: 1.25, 2: 1.5} and now['prop'][0.0] == {'mtp': [0.0, 0.1], 'draft2': [0.0, 0.3]}
    assert now['rho_k'][0.0]['mtp'] == pytest.approx({1: 1.0, 2: 1.5}) and _rho(now, 0.0, 'mtp')(2) == pytest.approx(1.5)
    assert now['t_step'][0.0] == pytest.approx(0.0038, rel=1e-12) and now['s'] is cst['s'] and cst['t1'] == 0.002   # the grid's costs untouched
    assert _costs_now(cst, 0.0, 'mtp', None, None, run) is cst and _costs_now(cst, 0.0, 'mtp', {1: 4e-3, 2: 5e-3, 3: 6e-3}, None, run) is cst

def test_run_grid_gives_each_group_the_costs_timed_when_it_opened(monkeypatch):
    "`_run_grid` hands every row of a proposer's group (the adaptive row's policy starts from these) the costs `_costs_now`"
    " makes from the passes and the plain step timed by the target alone's run that opened the group and from the"
    " proposer's call timed just before it, not the grid's costs: captured from its calls of run_config, with timings that"
    " change from one window to the next, so that a row handed the costs of another group or the grid's fails."
    import smallem_spec.bench as bench
    calls, n, primes = [], [0], []
    def fake_run(target, models, prompts, new_tokens, p, k, T, B, costs, seed=0, paired=None, prime=None):
        n[0] += 1; calls.append((p, k, T, costs)); primes.append(prime)
        return dict(seconds=0.01 * n[0], passes=20, prefill=0.001, prefills=1, tokens=20)
    passes = iter(range(1, 100))
    monkeypatch.setattr(bench, 'run_config', fake_run)
    monkeypatch.setattr(bench, '_window_passes', lambda target, cst: {t: 1e-3 * next(passes) * t for t in (1, 2, 3)})
    monkeypatch.setattr(bench, '_window_proposer', lambda target, models, prompts, p, T, cst: (0.0, 1e-4 * (2 if p == 'mtp' else 3), {1: 2e-3, 2: 3e-3}))
    class Bar:
        def update(self, n=1): pass
    cst = dict(t1=0.002, v={0: 1.0, 1: 1.0, 2: 1.0}, kmax=2, prop={0.0: {'mtp': [0.0, 0.5], 'draft2': [0.0, 0.3]}}, t_step={0.0: 0.0017},
               rho_k={}, s={0.0: {1: 0.0, 2: 0.0}})
    held = [[2], [3], [4], [5], [6]]
    raw = bench._run_grid(None, None, {}, [[1]], 20, [('mtp', 1), ('mtp', 'adaptive'), ('draft2', 'adaptive')], (0.0,), (1,), 1, {1: cst}, Bar(), prime=held)
    opened = [res for res, _, _ in raw[('none', 0, 0.0, 1)]]   # the target alone's runs that timed the passes, in order
    rows = [(p, k, c) for p, k, T, c in calls if p != 'none']
    assert [(p, k) for p, k, _ in rows] == [('mtp', 1), ('mtp', 'adaptive'), ('draft2', 'adaptive')]
    for (p, k, c), before in zip(rows, [opened[0], opened[0], opened[1]]):   # mtp's group opened by the first run, draft2's by the one closing mtp's
        want = bench._costs_now(cst, 0.0, p, before['pass_t'], bench._window_proposer(None, {}, [], p, 0.0, cst), before)
        assert c == want and c is not cst and c['t1'] == before['pass_t'][1], (p, k)
    assert rows[0][2]['t1'] != rows[2][2]['t1'] and rows[2][2]['prop'][0.0]['draft2'][1] == pytest.approx(3e-4 / rows[2][2]['t1'])
    assert [x for (p, *_), x in zip(calls, primes) if p != 'none'] == [None, held[:4], held[:4]]   # adaptive rows' policies decode 4 held-out texts first (batch 1)

def test_grid_row_prices_the_passes_timed_around_its_group():
    "The plain runs around a group also time the target's passes over 1..kmax+1 tokens (`pass_t`, as `measure_costs` times"
    "them), and the proposer's call is timed in the loop just before the group (`prop_t`, as `proposer_cost` gives it): the"
    "row's rounds are priced with those, not with the cost measurements' of minutes before. Here the passes around the"
    "group cost twice as much (t(1) 4 ms instead of 2) and a pass over 3 tokens 1.5 of one instead of 1.0: a round priced"
    "6 ms against 2, the predicted speed-up 2 x 4 / 6 instead of 4; with the proposer's call timed at 0.4 ms a guess (c ="
    "0.1 of this window's t(1)) and its verify passes as the microbenchmark's, 2 x 4 / 6.8. The control: the same runs"
    "without those timings are priced as before."
    from smallem_spec.bench import _grid_row
    from smallem_spec.spec import SpecStats
    st = SpecStats.from_log([(2, [2], [1])] * 10, 2, [[0] * 20], {'propose': 0.0, 'verify': 0.0, 'decide': 0.0, 'keep': 0.0, 'accept': 0.0, 'bookkeeping': 0.0}, 0.0, ['max_new_tokens'])
    plain = lambda pt: dict(seconds=4e-3 * 20, passes=20, tokens=20, texts=[[0] * 20], row_slots=0, stats=None, pass_t=pt)
    costs = {1: dict(t1=0.002, v={0: 1.0, 1: 1.0, 2: 1.0}, kmax=2, prop={0.0: {'mtp': [0.0, 0.0]}}, s={0.0: {2: 0.0}}, rho={0.0: {'mtp': 1.0}})}
    def row(pt, pw=None):
        around, res = (plain(pt), plain(pt)), dict(seconds=0.02, tokens=20, texts=[[0] * 20], row_slots=10, stats=st, prop_t=pw, chunks=0)
        raw = {('none', 0, 0.0, 1): [(around[0], None, None), (around[1], None, around[0])], ('mtp', 2, 0.0, 1): [(res, 250.0, around)]}
        return _grid_row(('mtp', 2, 0.0, 1), raw[('mtp', 2, 0.0, 1)], raw, costs, fast=True)
    passes = {1: 4e-3, 2: 5e-3, 3: 6e-3}
    timed, both, control = row(passes), row(passes, (0.0, 4e-4, {1: 5e-3, 2: 6e-3})), row(None)
    assert timed['predicted_speedup'] == pytest.approx(4 / 3, abs=1e-3) and timed['v_window'] == 1.5 and timed['pass_drift'] == 2.0
    assert both['predicted_speedup'] == pytest.approx(8 / 6.8, abs=1e-3) and both['c'] == 0.1 and both['verify_scale'] == 1.0
    assert control['predicted_speedup'] == 4.0 and control['v_window'] == 1.0 and control['pass_drift'] == 1.0 and control['c'] == 0.0

def test_adaptive_keeps_a_timed_k_that_pays_over_an_untimed_one_priced_a_little_better(monkeypatch):
    "The case traced on the AMD EPYC (draft4, greedy): k = 2 timed in its rounds, paying (x1.08 with acceptance 0.78 at"
    "each position); k = 1 never run, priced by the prior alone at x1.105 (in the traced run, once timed, it lost: x0.97)."
    "A k the prior alone prices must promise `explore` = 5% more than the best timed k that pays before the policy leaves"
    "it; the control (explore = 0) leaves k = 2 for k = 1. One priced 13% better (another prior) is still tried."
    import smallem_spec.cost as cost_mod
    now = [0.0]; monkeypatch.setattr(cost_mod.time, 'perf_counter', lambda: now[0])
    def policy(c=0.55, v0=1.0, vs=0.06, **kw):
        pol = AdaptiveK(6, c, lambda j: v0 + vs * j, probe_rounds=1, **kw)
        pol._t0 = now[0]; now[0] += 20.0; pol.update(0, [], [], steps=20)      # plain steps of 1 second: the unit
        pol._burst, pol._prev, pol.rounds = 0, 2, 8
        for _ in range(3): pol.update(2, [1], [2], seconds=2.211)             # k = 2 timed: 2.211 plain steps a round
        pol.acc, pol.seen = [78.0, 60.84, 0, 0, 0, 0], [100.0, 78.0, 0, 0, 0, 0]   # acceptance 0.78 at both positions
        return pol
    pol = policy(); g = pol.gains()
    assert 2 in pol.costs and 1 not in pol.costs and g[2] == pytest.approx(1.08, abs=0.005) and g[1] == pytest.approx(1.105, abs=0.005)
    assert policy().choose() == 2 and policy(explore=0.0).choose() == 1
    assert policy(c=0.5, v0=0.8, vs=0.25).choose() == 1                      # k = 1 priced at x1.22 (the offset seen at k = 2 applied): 13% better, tried

def test_adaptive_prices_rounds_by_their_own_verify_pass(monkeypatch):
    "A host whose speed alternates between 1 and 1.5 every 60 plain steps (both plain steps and rounds slow together, as on"
    "the shared AMD EPYC, where a round at k = 2 of one drafter cost from 1.6 to 2.3 plain steps from one call of 32 rounds"
    "to the next), a proposer that pays (rounds of 1.2 + 0.35 k plain steps, α = 0.75, a catch-up of 1), its rounds run"
    "in calls as the fused loop runs them, 8 texts of 200 tokens, mean of 8 seeds. Priced against the verify pass timed in"
    "the same call (`verify_price` and `step`, the fused loop reporting its verify passes), each round's cost in plain steps"
    "does not move with the host, and the policy keeps the gain a steady host gives (0.850 of plain decoding's time, against"
    "0.854 on a steady host); the control priced against the last plain steps timed mistakes slow moments for dear rounds"
    "and back (0.934). On a steady host the two are the same."
    import statistics
    pays, vp = (lambda k: 1.2 + 0.35 * k), (lambda k: 1.0 + 0.05 * k)
    square = lambda t: 1.5 if (t // 60) % 2 else 1.0
    def run(phase, same):
        kw = dict(verify=vp, step=1.0, verify_price=vp) if same else {}
        return statistics.mean(_simulate_timed(monkeypatch, alpha=0.75, round_cost_of=pays, catchup=1.0, seed=s, calls=True, phase=phase, **kw) for s in range(8))
    same, control, steady = run(square, True), run(square, False), run(None, True)
    assert same < 0.86 and control > 0.90 and abs(same - steady) < 0.01, (same, control, steady)
    assert run(None, False) == steady
    # by hand: a plain step is 2 units (`step`) and a verify pass at k = 2 is 1.5 units, so a verify pass timed at 3 s says a
    # plain step is worth 4 s in that call: a round of 4 s costs 1 plain step, whatever the plain steps timed earlier said
    pol = AdaptiveK(6, 0.5, lambda j: 1.0, unit=1.0, step=2.0, verify_price=lambda j: 1.5); pol._t0, pol._prev, pol.t_plain = 0.0, 2, 1.0
    pol.update(2, [1], [2], seconds=4.0, verify=3.0)
    assert pol.scale() == 0.5 and pol.costs[2] == 1.0 and pol.host == 0.0 and pol.ledger == 1.0 - 2.0

def test_adaptive_update_rounds_is_update_round_by_round(monkeypatch):
    "The fused loop reports a call's rounds at once (`update_rounds`): over 60 calls of a random mix (k from the policy's"
    "own choices, 1 to 32 rounds a call, random acceptance and seconds, plain stretches between), its state is the one"
    "`update` reaches round by round, to float rounding, and so are its choices. The control: a report that drops the"
    "last round of each call (as a loop counting from the wrong end would) is told apart."
    import random, math, smallem_spec.cost as cost_mod
    now = [0.0]; monkeypatch.setattr(cost_mod.time, 'perf_counter', lambda: now[0])
    def drive(report, seed=0):
        rng = random.Random(seed); pol = AdaptiveK(6, 0.3, lambda j: 1.0 + 0.1 * j, step=1.2, verify_price=lambda j: 1.0 + 0.1 * j)
        pol.start(); choices, states = [], []
        for _ in range(60):
            k = pol.choose(); choices.append((k, pol.steps))
            if k == 0:
                now[0] += pol.steps * 1.1; pol.update(0, [0], [0], steps=pol.steps); continue
            rounds = [([min(k, int(rng.expovariate(0.7)))], [k]) for _ in range(rng.randint(1, 32))]
            secs = [rng.uniform(1.0, 2.0) * (1 + 0.3 * k) for _ in rounds]; now[0] += sum(secs) + 0.05 * len(rounds)
            report(pol, k, rounds, secs, verify=1.0 + 0.1 * k)
            states.append((pol.acc[:], pol.seen[:], dict(pol.costs), pol.host, dict(pol.timed_rounds), pol.rounds, pol._burst, pol.done, pol.ledger, pol.over))
        return choices, states
    def one_by_one(pol, k, rounds, secs, verify):
        for j, (na, ks) in enumerate(rounds): pol.update(k, na, ks, seconds=secs[j], more=j > 0, verify=verify)
    batched = lambda pol, k, rounds, secs, verify: pol.update_rounds(k, rounds, secs, verify=verify)
    dropped = lambda pol, k, rounds, secs, verify: pol.update_rounds(k, rounds[:-1] or rounds, secs[:-1] or secs, verify=verify)
    def same(a, b):
        if isinstance(a, dict): return a.keys() == b.keys() and all(same(a[x], b[x]) for x in a)
        if isinstance(a, (list, tuple)): return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    for seed in range(3):
        (c1, s1), (c2, s2) = drive(one_by_one, seed), drive(batched, seed)
        assert c1 == c2 and same(s1, s2), seed
        assert any(k > 0 for k, _ in c1) and any(k == 0 for k, _ in c1)   # both kinds of report ran
    assert not same(drive(one_by_one)[1], drive(dropped)[1])

def test_adaptive_untimed_k_priced_to_lose_runs_a_probes_length():
    "Outside a probe, a k whose prices say it loses but which has not been timed yet runs `probe_rounds` rounds (enough to"
    "time it), not `ahead`: a trace of draft2 at T = 1 on the AMD EPYC without AVX-512 showed such a k run 32 rounds at"
    "about x0.85 before the policy could let it go. A k priced to pay still runs `ahead` rounds; once the losing k is timed"
    "(and past the hope of thin evidence), plain steps."
    def ready(c):
        pol = AdaptiveK(6, c, lambda j: 1.5); pol.t_plain, pol.hopeless, pol._burst, pol._timed_at = 1.0, False, 0, 0
        return pol
    pol = ready(0.5); k = pol.choose()
    assert k >= 1 and max(pol.gains().values()) < 1.0 and pol.steps == pol.probe_rounds == 4
    pol.timed_rounds[k], pol.costs[k], pol._ts[k] = 100, pol.cost(k), [pol.cost(k)]
    assert pol.choose() == 0 and pol.steps >= pol.probe_every
    pays = ready(0.01); pays.acc, pays.seen = [9.0] * 6, [10.0] * 6
    assert pays.choose() >= 1 and pays.steps == pays.ahead == 32

def test_adaptive_calibrates_its_verify_unit_by_the_plain_steps_before(monkeypatch):
    "A round is priced against its own verify pass times `step / verify_price(k)`, ratios measured once beforehand; on the"
    "AMD EPYC without AVX-512 those three rounds of measurements were off by up to a quarter either way (traces: MTP greedy"
    "k = 1 priced at 1.81-1.86 plain steps where its fixed-k row said 1.46, and at 1.32-1.40 where it said 1.55-1.60)."
    "Here the prior's `step` is 1.25 or 0.8 times the truth, rounds in calls as the fused loop runs them, 8 texts, mean"
    "of 8 seeds. The policy pairs each timed stretch of plain steps with the verify passes of the call right after it and"
    "corrects the unit by the median ratio: a losing proposer (rounds of 1.3 + 0.35 k, α = 0.6) priced cheap stays within"
    "1.5% of plain decoding (1.012) where the uncorrected policy speculates and loses 3.4%; a paying one (1.2 + 0.35 k,"
    "α = 0.75) priced dear keeps its gain (0.846) where the uncorrected one stops (0.984). With the right prior the two are"
    "the same; on a host alternating between two speeds the correction holds too."
    import statistics
    vp = lambda k: 1.0 + 0.05 * k
    lose, pays = (lambda k: 1.3 + 0.35 * k), (lambda k: 1.2 + 0.35 * k)
    square = lambda t: 1.5 if (t // 60) % 2 else 1.0
    def run(cost, alpha, step, cal, phase=None):
        return statistics.mean(_simulate_timed(monkeypatch, alpha=alpha, round_cost_of=cost, catchup=1.0, seed=s, calls=True, verify=vp,
                                               step=step, verify_price=vp, calibrate=cal, phase=phase) for s in range(8))
    cal, raw = run(lose, 0.6, 1.25, True), run(lose, 0.6, 1.25, False)
    assert cal <= 1.015 and raw > 1.03, (cal, raw)
    cal, raw = run(pays, 0.75, 0.8, True), run(pays, 0.75, 0.8, False)
    assert cal < 0.86 and raw > 0.97, (cal, raw)
    assert run(pays, 0.75, 1.0, True) == run(pays, 0.75, 1.0, False) and run(lose, 0.6, 1.0, True) == run(lose, 0.6, 1.0, False)
    assert run(pays, 0.75, 0.8, True, square) < 0.86 and run(lose, 0.6, 1.25, True, square) <= 1.015
