"The foundation: paged == dense == full forward; cached == uncached generation; bad input refused with state intact."
import pytest, torch
from smallem_spec.model import Smallem, model_config
from smallem_spec.generate import generate
from smallem_spec.core import SmallemError, preset_name
from smallem_spec.corpus import load_corpus, validation_prompts, load_tokenizer
from smallem_spec.train import load_or_train

def test_paged_equals_full_forward_cpu_preset():
    torch.manual_seed(0)
    m = Smallem(model_config('cpu', 'target')).eval()
    x = torch.randint(1, m.cfg.vocab_size, (3, 120))
    with torch.no_grad():
        full = m(x)
        c = m.new_cache(batch=3, page_size=16); s = [c.new_seq() for _ in range(3)]
        parts, pos = [], 0
        for n in (37, 1, 8, 2, 72):   # prefill, decode, verify-sized chunks
            parts.append(m(x[:, pos:pos + n], c, s)); pos += n
        err = (torch.cat(parts, 1) - full).abs().max().item()
    assert err < 1e-4, f"paged cache vs full forward: max abs difference {err} (tolerance 1e-4, fp32)"

def test_cached_generation_equals_uncached(cpu_models, prompts):
    t = cpu_models['target']
    out = generate(t, prompts[:3], 40)
    for p, o in zip(prompts[:3], out):
        seq = list(p)
        with torch.no_grad():
            for _ in range(40): seq.append(t(torch.tensor([seq]))[0, -1].argmax().item())
        assert seq[len(p):] == o

def test_greedy_independent_of_seed(cpu_models, prompts):
    t = cpu_models['target']
    a = generate(t, prompts, 30, generator=torch.Generator().manual_seed(1))
    assert a == generate(t, prompts, 30, generator=torch.Generator().manual_seed(2))

def test_keep_then_reappend(cpu_models):
    t = cpu_models['target']; x = torch.randint(1, t.cfg.vocab_size, (1, 50), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        c = t.new_cache(); s = c.new_seq()
        t(x[:, :30], c, [s]); ref = t(x[:, 30:50], c, [s])
        c.keep(s, 30); c.check()
        assert (t(x[:, 30:50], c, [s]) - ref).abs().max() < 1e-5

def test_bad_input_foundation(cpu_models):
    t = cpu_models['target']
    for prompts, msg in [([[]], 'empty'), ([[1, t.cfg.vocab_size]], 'outside the vocabulary'),
                         ([[1] * (t.cfg.max_seq_len + 1)], 'longer than the context'), ([], 'non-empty list')]:
        with pytest.raises(SmallemError, match=msg): generate(t, prompts, 5)
    c = t.new_cache(n_pages=2); s = c.new_seq()
    with pytest.raises(SmallemError, match='page pool exhausted'): t(torch.ones(1, 40, dtype=torch.long), c, [s])
    assert c.length(s) == 0 and c.n_free() == 2       # nothing half-applied
    with pytest.raises(SmallemError, match='unknown preset'): preset_name('huge')
    with pytest.raises(SmallemError, match='corpus path not found'): load_corpus('/no/such/file.txt')
    with pytest.raises(SmallemError, match='unknown model name'): load_or_train('cpu', 'draft3')
    assert len(generate(t, [[5, 6, 7]], 3)[0]) == 3   # still usable

def test_validation_prompts_deterministic():
    a = validation_prompts('cpu', 8, 32)
    assert a == validation_prompts('cpu', 8, 32) and len(a) == 8 and all(len(p) == 32 for p in a)
    tok = load_tokenizer('cpu')
    assert tok.encode(tok.decode(a[0])).ids is not None

@pytest.mark.parametrize('path', ['reference', 'fast'])
def test_a_repeated_prompt_is_read_once(cpu_models, prompts, path):
    """`prefill` reads a prompt the batch repeats once and copies its keys and values to the other rows: the logits, the
    hidden states (what the MTP module starts from) and every row's cache are those of a pass of the row's own, and
    the greedy texts of the batch are those of each row decoded alone."""
    from smallem_spec.generate import prefill
    from smallem_spec.fast import FastSmallem
    t = cpu_models['target'] if path == 'reference' else FastSmallem(cpu_models['target'])
    rep = [prompts[0], prompts[1][:20], prompts[0], prompts[0], prompts[1][:20]]
    ca, cb = t.new_cache(capacity=[40] * 5), t.new_cache(capacity=[40] * 5)
    sa, sb = [ca.new_seq() for _ in rep], [cb.new_seq() for _ in rep]
    with torch.no_grad():
        la, ha = prefill(t, ca, sa, rep, return_hidden=True)
        own = [prefill(t, cb, [s], [p], return_hidden=True) for s, p in zip(sb, rep)]
    assert (la - torch.cat([o[0] for o in own])).abs().max() < 1e-4
    for i, (p, (_, h)) in enumerate(zip(rep, own)):
        assert (ha[i, :len(p)] - h[0, :len(p)]).abs().max() < 1e-4, f"row {i}: hidden states"
        assert all((u - w).abs().max() < 1e-4 for u, w in zip(ca.prefix(sa[i], len(p)), cb.prefix(sb[i], len(p)))), f"row {i}: cache"
        assert ca.length(sa[i]) == len(p)
    out = generate(t, rep, 20)   # greedy texts of the batch with repeats, against each row decoded alone
    assert out == [generate(t, [p], 20)[0] for p in rep]
