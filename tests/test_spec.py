"Greedy speculative decoding equals plain greedy decoding; both caches hold exactly the accepted prefix."
import pytest, torch
from smallem_spec.generate import generate
from smallem_spec.spec import speculative_generate, DraftProposer, ConstantProposer
from smallem_spec.verify import verify_greedy
from smallem_spec.core import SmallemError

NEW = 200

@pytest.fixture(scope='module')
def reference(cpu_models, prompts):
    return generate(cpu_models['target'], prompts, NEW)

@pytest.mark.parametrize('proposer', ['self', 'draft2', 'constant'])
def test_greedy_identity(cpu_models, prompts, reference, proposer):
    "8 validation prompts x 200 tokens, k = 1..4, at B = 1 and B = 8: exactly the target's greedy tokens."
    t = cpu_models['target']
    make = {'self': lambda: DraftProposer(t), 'draft2': lambda: DraftProposer(cpu_models['draft2']),
            'constant': lambda: ConstantProposer(t.cfg.vocab_size)}[proposer]
    for k in (1, 2, 3, 4):
        out, st = speculative_generate(t, make(), prompts, NEW, k)
        assert out == reference, f"{proposer}, k={k}, B=8: differs from plain greedy"
        if proposer == 'self': assert st['acceptance'] == 1.0, f"the target proposing for itself accepted {st['acceptance']}"
        for i, p in enumerate(prompts):
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

def test_no_page_leak_over_many_runs(cpu_models, prompts):
    "Proposer and target caches are freed; a pool reused by many runs shows no growth."
    d = DraftProposer(cpu_models['draft2'])
    for _ in range(3): speculative_generate(cpu_models['target'], d, prompts[:2], 20, 2)
    assert d.cache.n_free() == d.cache.n_pages and not d.cache.lens

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
