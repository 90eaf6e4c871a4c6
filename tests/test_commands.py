"""Commands: --help works; bad flags and unwritable outputs give a one-line error and exit status 2, never a traceback,
before any long work, and a refused command writes nothing."""
import os, subprocess, sys
import pytest

COMMANDS = ['smallem_train', 'smallem_generate', 'smallem_exactness', 'smallem_bench', 'smallem_export_hf', 'smallem_export_gguf', 'smallem_kernels']

BIN = os.path.dirname(sys.executable)     # the console scripts installed beside this interpreter (.venv/bin)

def run(cmd, *args, timeout=600, cwd=None):
    exe = os.path.join(BIN, cmd)
    return subprocess.run([exe if os.path.exists(exe) else cmd, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)

@pytest.mark.parametrize('cmd', COMMANDS)
def test_help(cmd):
    r = run(cmd, '--help')
    assert r.returncode == 0 and 'usage:' in r.stdout and '--preset' in r.stdout

REFUSED = [
    ('smallem_train', ['--preset', 'huge'], 'unknown preset'),
    ('smallem_train', ['--name', 'draft3', '--preset', 'tiny'], 'unknown model name'),
    ('smallem_train', ['--steps', '0', '--preset', 'tiny'], '--steps must be'),
    ('smallem_train', ['--dropout', '1.5', '--preset', 'tiny'], '--dropout must be'),
    ('smallem_train', ['--layers', '0', '--preset', 'tiny'], '--layers must be'),
    ('smallem_train', ['--dim', '0', '--preset', 'tiny'], '--dim must be'),
    ('smallem_train', ['--ema', '1', '--preset', 'tiny'], '--ema must be'),
    ('smallem_train', ['--mtp-weight', 'inf', '--preset', 'tiny'], '--mtp-weight must be'),
    ('smallem_train', ['--mtp-distill', '0', '--name', 'target', '--preset', 'tiny'], '--mtp-distill must be'),
    ('smallem_train', ['--bogus'], 'unrecognized arguments'),
    ('smallem_generate', ['--temperature', '-1'], 'temperature'),
    ('smallem_generate', ['--temperature', 'abc'], 'invalid float value'),
    ('smallem_exactness', ['--pairs', '3'], 'too small'),
    ('smallem_exactness', ['--proposer', 'oracle', '--pairs', '2000', '--positions', '5000'], 'unknown proposer'),
    ('smallem_exactness', ['--e2e', '1000'], '--e2e is too small'),
    ('smallem_generate', ['--temperature', 'inf'], 'finite number'),
    ('smallem_bench', ['--temperature', 'inf'], 'finite number'),
    ('smallem_bench', ['--proposers', 'oracle'], 'unknown proposer'),
    ('smallem_bench', ['--k', 'two'], 'invalid k'),
    ('smallem_bench', ['--k', '0'], 'bad k'),
    ('smallem_bench', ['--temperature', '-1'], 'temperature'),
    ('smallem_bench', ['--batch', '0'], 'must be >= 1'),
    ('smallem_bench', ['--preset', 'huge'], 'unknown preset'),
    ('smallem_bench', ['--reference', '--precision', 'bf16'], 'runs in fp32'),
    ('smallem_bench', ['--precision', 'fp8'], 'invalid choice'),
    ('smallem_bench', ['--trees', '3x'], 'tree shape'),
    ('smallem_bench', ['--trees', '2', '--proposers', 'ngram'], 'grow from a drafter'),
    ('smallem_bench', ['--trees', '8x8', '--proposers', 'mtp'], 'at most 64 nodes'),
    ('smallem_kernels', ['--reps', '1'], 'need --reps'),
    ('smallem_kernels', ['--preset', 'huge'], 'unknown preset'),
    ('smallem_kernels', ['--json', '/nonexistent/dir/k.json'], 'cannot write --json'),
    ('smallem_bench', ['--json', '/nonexistent/dir/b.json'], 'cannot write --json'),
    ('smallem_bench', ['--plot', '/nonexistent/dir/b.png'], 'cannot write --plot'),
    # {tmp} is an empty folder holding one file, f: a refused command must leave it so (no output created or emptied)
    ('smallem_bench', ['--json', '{tmp}/b.json', '--proposers', 'oracle'], 'unknown proposer'),  # was: an empty b.json left
    ('smallem_kernels', ['--json', '{tmp}/k.json', '--preset', 'huge'], 'unknown preset'),     # was: an empty k.json left
    ('smallem_train', ['--out', '{tmp}/f/sub', '--preset', 'tiny', '--steps', '1'], 'cannot write --out'),   # was: a traceback
    ('smallem_train', ['--minutes', 'nan', '--preset', 'tiny', '--out', '{tmp}/o'], '--minutes must be'),  # was: trained on
    ('smallem_generate', ['--new-tokens', '-1'], 'max_new_tokens'),
    ('smallem_generate', ['--model', 'draft3'], 'unknown model name'),
    ('smallem_export_hf', ['--out', '{tmp}/f/sub'], 'cannot write to output folder'),
    ('smallem_exactness', ['--preset', 'huge'], 'unknown preset'),
]

@pytest.fixture(scope='module')
def refused(run_commands, tmp_path_factory):
    "Every line of REFUSED run in one interpreter, each in its own empty folder holding one file, f."
    dirs = [tmp_path_factory.mktemp(f'refused{i}') for i in range(len(REFUSED))]
    for d in dirs: (d/'f').write_text('a file')
    res = run_commands([(cmd, [a.replace('{tmp}', str(d)) for a in args], d) for (cmd, args, _), d in zip(REFUSED, dirs)])
    return list(zip(res, dirs))

@pytest.mark.parametrize('i', range(len(REFUSED)), ids=[f'{c}-{m}' for c, _, m in REFUSED])
def test_bad_flags(refused, i):
    (cmd, _, msg), (r, tmp_path) = REFUSED[i], refused[i]
    assert r.rc == 2, r.stderr
    assert r.seconds < 60, f"refused after {r.seconds:.0f} s: the check should come before any long work"
    assert 'Traceback' not in r.stderr and msg in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith(f'{cmd}: error:'), lines
    assert len(lines) == 1 or lines[0].startswith('usage:'), f"more than the error (or argparse's usage and error): {lines}"
    assert os.listdir(tmp_path) == ['f'] and (tmp_path/'f').read_text() == 'a file', f"the refused command wrote {os.listdir(tmp_path)}"

def test_exactness_refuses_powerless_counts():
    "Counts that cannot reject the negative controls are bad values: exit 2 and one line, not a failed certification."
    r = run('smallem_exactness', '--pairs', '100', '--positions', '100', '--e2e', '0', timeout=120)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, (r.returncode, r.stdout[-500:])
    assert r.stderr.strip().splitlines()[-1].startswith('smallem_exactness: error:') and 'too small' in r.stderr

def test_generate_runs():
    r = run('smallem_generate', '--preset', 'cpu', '--new-tokens', '20')
    assert r.returncode == 0, r.stderr
    assert 'tokens/s' in r.stdout

def test_exactness_command():
    "7 chi-squared tests at 0.1% must pass (pairs; the worst of 3 positions in two cases, so 6): false-failure rate at most 0.7%; the 2 controls must reject."
    r = run('smallem_exactness', '--pairs', '50000', '--positions', '30000', '--e2e', '0')   # e2e: tests/test_verify.py
    assert r.returncode == 0, r.stdout + r.stderr + '\nverdicts not as expected (false-failure rate at most 0.7%)'
    assert 'verdicts as expected' in r.stdout and 'REJECT' in r.stdout, r.stdout   # the controls are rejected
    print(r.stdout)

def test_bench_small(tmp_path):
    j, png = tmp_path/'b.json', tmp_path/'b.png'
    r = run('smallem_bench', '--preset', 'cpu', '--prompts', '2', '--new-tokens', '12', '--k', '1,2,adaptive', '--proposers', 'draft2,mtp,ngram',
            '--temperature', '0,1', '--batch', '1,2', '--trees', '2x1,adaptive', '--json', str(j), '--plot', str(png))
    assert r.returncode == 0, r.stderr[-2000:]
    import json
    res = json.loads(j.read_text()); rows = res['rows']
    assert res['meta']['cpu_info']['model'] and res['meta']['torch'] == __import__('torch').__version__   # the file says where it was measured
    keys = {'proposer', 'k', 'temperature', 'batch', 'tokens_per_s', 'speedup', 'alpha_per_position', 'tokens_per_round', 'predicted_speedup', 'identical'}
    assert all(keys <= set(r) for r in rows)
    trees = [r for r in rows if r['proposer'].endswith('_tree')]; rows = [r for r in rows if r not in trees]
    assert len(rows) == 2 * 2 * (2 + 3 * 3), len(rows)     # target alone on the fast path and on the reference code, 9 speculative rows
    where = 'library' if __import__('smallem_spec.fused', fromlist=['load_kernel']).load_kernel() is not None else 'python'   # static trees: the fused library's rounds
    fixed, adaptive = [r for r in trees if r['k'] == '2x1'], [r for r in trees if r['k'] == 'adaptive']
    assert len(fixed) == len(adaptive) == 2 * 2 * 2 and {(r['proposer'], r['rounds']) for r in fixed} == {('mtp_tree', where), ('draft2_tree', where)}   # --trees 2x1: every proposer but ngram
    assert all(r['identical'] for r in trees if r['temperature'] == 0) and all(r['predicted_speedup'] > 0 for r in trees)
    # adaptive: untimed, the policy ran its hull on held-out prompts (until the root's children are counted, 3 requests at most) and, sampled, a chain of 4 (until its first guess is counted, 3 requests at most; greedy, a chain's guesses are the trees' first children, already counted): 4 requests in all; then it chose each timed request's tree or chain
    assert all(r['primed'][0] == '3x2x1x1' and r['primed'].count('3x2x1x1') <= 3 and ('chain 4' in r['primed']) == (r['temperature'] > 0) and len(r['primed']) == 4
               and sum(r['chosen'].values()) == r['repeats'] * (2 // r['batch'])
               for r in adaptive), [(r['primed'], r['chosen']) for r in adaptive]
    assert 'trees: best' in r.stdout, r.stdout[-1500:]
    assert all(r['identical'] for r in rows if r['temperature'] == 0 and not r['proposer'].startswith('none')), "a greedy row differs from the target alone"
    assert {r['path'] for r in rows if r['proposer'] == 'none (reference)'} == {'reference'} and {r['path'] for r in rows if r['proposer'] == 'mtp'} == {'fast'}
    assert png.stat().st_size > 10_000

def test_bench_bf16(tmp_path):
    "--precision bf16: every fast model on bf16 panels, the target alone too; the greedy texts still the target alone's, the file says so."
    from smallem_spec.fused import has_bf16
    if not has_bf16(): pytest.skip("no AVX-512 BF16 on this processor")
    j = tmp_path/'b.json'
    r = run('smallem_bench', '--preset', 'cpu', '--prompts', '2', '--new-tokens', '12', '--k', '1,adaptive', '--proposers', 'draft2,mtp',
            '--temperature', '0', '--precision', 'bf16', '--json', str(j))
    assert r.returncode == 0, r.stderr[-2000:]
    import json
    res = json.loads(j.read_text())
    assert res['meta']['precision'] == 'bf16' and res['meta']['drafter_panels'] == 'bf16' and 'bf16' in r.stdout
    assert all(x['identical'] for x in res['rows'] if not x['proposer'].startswith('none'))

def test_kernels_command(tmp_path):
    j = tmp_path/'k.json'
    r = run('smallem_kernels', '--preset', 'cpu', '--reps', '5', '--mb', '128', '--json', str(j))
    assert r.returncode == 0, r.stderr[-2000:]
    import json
    res = json.loads(j.read_text())
    t = res['models']['target']
    assert set(res['models']) == {'target', 'draft2', 'draft4'} and res['machine']['bandwidth_gbs'] > 0
    assert t['fast']['t_ms']['1'] > 0 and t['floor_ms']['1'] > 0 and set(t['fast']['v']) == {str(k) for k in range(8)}
    assert 'read bandwidth' in r.stdout and 'target' in r.stdout
