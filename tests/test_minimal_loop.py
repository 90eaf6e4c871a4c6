"""The smallest speculative loops of `05_greedy` (`tiny_greedy`, `tiny_sampled`: notebook code, not exported), tested harder
than the notebook can afford: more prompts, proposers and k for the greedy loop, against the target alone and against the
fast loop round by round; for the sampled loop, the law of three tokens (one round of k = 3 guesses) on toy bigram models by
chi-squared at the 0.1% level, and four wrong loops (the correct one's source with one known bug planted) that it must reject.

The loops are read from the notebook's cells, so these tests check the code the page shows.
"""
import json
from pathlib import Path
import pytest, torch
from scipy import stats as sstats
from smallem_spec.generate import generate
from smallem_spec.spec import speculative_generate, DraftProposer
from smallem_spec.verify import gof

NB = Path(__file__).resolve().parent.parent/'nbs'/'05_greedy.ipynb'

def cell(marker:str) -> str:
    "The source of the one code cell of 05_greedy that contains `marker`."
    found = [''.join(c['source']) for c in json.loads(NB.read_text())['cells'] if c['cell_type'] == 'code' and marker in ''.join(c['source'])]
    assert len(found) == 1, f"05_greedy has {len(found)} code cells containing {marker!r}"
    return found[0]

def load(marker:str, name:str, plant:tuple[str, str]|None=None):
    "Define the notebook's function `name` from its cell, with one bug planted (`plant`: a line fragment and its replacement)."
    src = cell(marker)
    if plant is not None:
        assert plant[0] in src, f"the line to plant a bug in is not in the notebook's {name}: {plant[0]!r}"
        src = src.replace(plant[0], plant[1])
    ns = {'torch': torch}; exec(src, ns); return ns[name]

@pytest.fixture(scope='module')
def tiny_greedy(): return load('def tiny_greedy', 'tiny_greedy')

@pytest.mark.parametrize('drafter', ['draft2', 'draft4'])
def test_greedy_loop_is_the_target_alone_and_the_fast_loop(cpu_models, prompts, tiny_greedy, drafter):
    target, draft = cpu_models['target'], cpu_models[drafter]
    ps = prompts[:4]; ref = generate(target, ps, 40)
    for k in (1, 2, 5):
        for p, r in zip(ps, ref):
            out, kinds = tiny_greedy(target, draft, p, 40, k)
            assert out == r, f"the small greedy loop ({drafter}, k={k}) departs from the target's greedy text"
            assert len(kinds) == 40 and kinds[0] == 'plain'
            sizes, n = [], 0                                              # tokens emitted by each round of the small loop
            for kind in kinds[1:]:
                n += 1
                if kind != 'accepted': sizes.append(n); n = 0
            lens = [1]
            fast, st = speculative_generate(target, DraftProposer(draft), [p], 40, k, on_round=lambda c, s, o: lens.append(len(o[0])))
            assert fast[0] == out and st.accepted == kinds.count('accepted')
            assert [b - a for a, b in zip(lens, lens[1:])] == sizes, f"the fast loop's rounds differ from the small loop's ({drafter}, k={k})"
            assert max(sizes) <= k + 1

class Bigram(torch.nn.Module):
    "A toy model whose next token's logits depend only on the current token."
    def __init__(self, z): super().__init__(); self.z = z                 # [V, V]
    def forward(self, x): return self.z[x]                                # [B, T] -> [B, T, V]

V, K, N, ALPHA = 5, 3, 40_000, 1e-3
gz = torch.Generator().manual_seed(2)
ZP = torch.randn(V, V, generator=gz) * 1.5; ZQ = ZP + torch.randn(V, V, generator=gz) * 1.5
P = torch.softmax(ZP, -1).double()                                        # P[a, b] = p(b | a)
# the law of tokens 2, 3 and 4 after the one-token prompt [0]: the first is the prompt pass's, then one round of K guesses
JOINT = ((P[0] @ P)[:, None, None] * P[:, :, None] * P[None]).flatten().numpy()

ACCEPT = "torch.rand(1, generator=g) * qs[n][guess[n]] < ps[n][guess[n]]"
DRAW = "guess.append(int(torch.multinomial(qs[-1], 1, generator=g)))"
BUGS = {
    'correction from p': None,                                            # the loop's own residual=False
    'every guess kept': (ACCEPT, "True"),
    'kept with probability p(x)': (ACCEPT, "torch.rand(1, generator=g) < ps[n][guess[n]]"),
    "q is not the law the guess was drawn from (argmax)": (DRAW, "guess.append(int(qs[-1].argmax()))"),
}

def chi2_of(loop, residual=True, seed=0):
    "Pearson's statistic of N generations' tokens 2-4 against the target's law, cells expected under 5 merged; (stat, dof)."
    tp, tq, g = Bigram(ZP), Bigram(ZQ), torch.Generator().manual_seed(seed)
    obs = torch.zeros(V ** 3, dtype=torch.float64)
    for _ in range(N):
        a, b, c = loop(tp, tq, [0], 4 + 1, K, g, residual)[1:4]
        obs[(a * V + b) * V + c] += 1
    s, _, df = gof(obs.numpy(), JOINT * N)
    return s, df

def test_sampled_loop_follows_the_target():
    s, df = chi2_of(load('def tiny_sampled', 'tiny_sampled'))
    thr = sstats.chi2.ppf(1 - ALPHA, df)
    assert s < thr, f"the small sampled loop departs from p: chi2 {s:.1f} >= {thr:.1f} ({df} dof; a correct loop fails with probability {ALPHA})"

@pytest.mark.parametrize('bug', list(BUGS))
def test_sampled_law_test_rejects_planted_bugs(bug):
    loop = load('def tiny_sampled', 'tiny_sampled', BUGS[bug])
    s, df = chi2_of(loop, residual=BUGS[bug] is not None)
    thr = sstats.chi2.ppf(1 - ALPHA, df)
    assert s > thr, f"the chi-squared test did not reject a loop with the bug '{bug}': chi2 {s:.1f} <= {thr:.1f} ({df} dof)"
