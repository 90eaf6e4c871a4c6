"""The library's shape: its modules import each other only in the order the index states (so there is no cycle),
`verify` holds the rules and imports nothing above `core`, pyflakes finds nothing, and `cost.py` works from the
installed library."""
import ast, re, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT/'smallem_spec'
MODULES = sorted(p.stem for p in LIB.glob('*.py') if p.stem not in ('__init__', '_modidx'))

def stated_order() -> list[str]:
    "The import order the README states (it is generated from nbs/index.ipynb)."
    m = re.search(r'Import order: (.+)', (ROOT/'README.md').read_text())
    assert m, "README.md states no 'Import order: ...' line"
    return [x.strip(' `.') for x in m.group(1).split('→')]

def lib_imports(name:str) -> set[str]:
    "Every smallem_spec module that module `name` imports, wherever the import is (module level or inside a function)."
    out = set()
    for node in ast.walk(ast.parse((LIB/f'{name}.py').read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.level == 1: out.add(node.module.split('.')[0])
            elif node.module.startswith('smallem_spec.'): out.add(node.module.split('.')[1])
        elif isinstance(node, ast.ImportFrom) and node.level == 1: out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import): out.update(a.name.split('.')[1] for a in node.names if a.name.startswith('smallem_spec.'))
        elif isinstance(node, ast.Call) and getattr(node.func, 'id', '') in ('__import__', 'import_module') and node.args \
             and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith('smallem_spec.'):
            out.add(node.args[0].value.split('.')[1])
    return out - {name}

def other_imports(name:str) -> set[str]:
    "Top-level packages other than smallem_spec that module `name` imports."
    out = set()
    for node in ast.walk(ast.parse((LIB/f'{name}.py').read_text())):
        if isinstance(node, ast.Import): out.update(a.name.split('.')[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module: out.add(node.module.split('.')[0])
    return out - {'smallem_spec'}

def test_every_module_is_in_the_stated_order():
    assert sorted(stated_order()) == MODULES, f"stated {stated_order()} vs modules {MODULES}"

def test_imports_follow_the_stated_order():
    order = stated_order(); rank = {m: i for i, m in enumerate(order)}
    bad = [f"{m} imports {d}" for m in order for d in sorted(lib_imports(m)) if rank.get(d, len(order)) >= rank[m]]
    assert not bad, "imports against the stated order: " + '; '.join(bad)

def test_no_import_cycle():
    "Independent of the stated order: a depth-first walk of the import graph finds no cycle."
    graph = {m: lib_imports(m) & set(MODULES) for m in MODULES}
    state = {}
    def walk(m, path):
        state[m] = 1
        for d in graph[m]:
            assert state.get(d) != 1, "import cycle: " + ' -> '.join(path + [m, d])
            if d not in state: walk(d, path + [m])
        state[m] = 2
    for m in MODULES:
        if m not in state: walk(m, [])

def test_verify_holds_the_rules_only():
    assert lib_imports('verify') <= {'core'}, lib_imports('verify')
    assert other_imports('verify') <= {'__future__', 'torch', 'numpy', 'scipy'}, other_imports('verify')

def test_the_planted_cycle_is_caught(tmp_path, monkeypatch):
    "The checks can fail: a module that imports one placed after it is reported."
    fake = tmp_path/'smallem_spec'; fake.mkdir()
    (fake/'core.py').write_text('from .verify import verify_greedy\n'); (fake/'verify.py').write_text('from .core import sync\n')
    monkeypatch.setattr(sys.modules[__name__], 'LIB', fake)
    assert lib_imports('core') == {'verify'} and lib_imports('verify') == {'core'}
    with pytest.raises(AssertionError, match='against the stated order'):
        monkeypatch.setattr(sys.modules[__name__], 'stated_order', lambda: ['core', 'verify'])
        test_imports_follow_the_stated_order()

def test_pyflakes_finds_nothing():
    r = subprocess.run([sys.executable, '-m', 'pyflakes', str(LIB), str(ROOT/'tests')], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr

def test_cost_from_the_installed_library():
    "In a fresh interpreter: measure_v on the tiny target, and the cost model against its closed forms."
    code = r'''
import math, torch
from smallem_spec.cost import measure_v, expected_tokens, expected_tokens_pos, predicted_speedup, best_k, alpha_for, round_cost
from smallem_spec.model import Smallem, model_config
m = measure_v(Smallem(model_config('tiny', 'target')).eval(), kmax=3, context=16, reps=3)
assert m['t1'] > 0 and m['v'][0] == 1.0 and sorted(m['v']) == [0, 1, 2, 3], m
assert math.isclose(expected_tokens(0.5, 3), 1 + 0.5 + 0.25 + 0.125)
assert expected_tokens(1.0, 4) == 5 and expected_tokens(0.0, 4) == 1
assert math.isclose(expected_tokens_pos([0.5, 0.5, 0.5]), expected_tokens(0.5, 3))
assert math.isclose(expected_tokens_pos([0.8, 0.5]), 1 + 0.8 + 0.4)
assert math.isclose(alpha_for(expected_tokens(0.7, 4), 4), 0.7, abs_tol=1e-9)
assert round_cost(3, 0.1, lambda k: 1 + 0.05 * k) == 3 * 0.1 + 1.15
assert math.isclose(predicted_speedup([0.9, 0.9], 0.1, 1.0), (1 + 0.9 + 0.81) / 1.2)
k, s = best_k([0.9] * 8, 0.0, lambda k: 1.0)          # free guesses, flat verify: the longest round wins
assert k == 8 and math.isclose(s, expected_tokens(0.9, 8))
k, s = best_k([0.5] * 8, 0.6, 1.0)                    # dear guesses, poor acceptance: one guess, and it loses
assert k == 1 and s < 1
print('ok')
'''
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd='/')
    assert r.returncode == 0 and r.stdout.strip() == 'ok', r.stdout + r.stderr
