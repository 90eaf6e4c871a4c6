"Commands: --help works; bad flags give a usage line and a one-line error, never a traceback."
import subprocess
import pytest

COMMANDS = ['smallem_train', 'smallem_generate', 'smallem_exactness', 'smallem_bench', 'smallem_export_hf', 'smallem_kernels']

def run(*args, timeout=600):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)

@pytest.mark.parametrize('cmd', COMMANDS)
def test_help(cmd):
    r = run(cmd, '--help')
    assert r.returncode == 0 and 'usage:' in r.stdout and '--preset' in r.stdout

@pytest.mark.parametrize('cmd,args,msg', [
    ('smallem_train', ['--preset', 'huge'], 'unknown preset'),
    ('smallem_train', ['--name', 'draft3', '--preset', 'tiny'], 'unknown model name'),
    ('smallem_train', ['--steps', '0', '--preset', 'tiny'], '--steps must be'),
    ('smallem_train', ['--bogus'], 'unrecognized arguments'),
    ('smallem_generate', ['--temperature', '-1'], 'temperature'),
    ('smallem_generate', ['--temperature', 'abc'], 'invalid float value'),
    ('smallem_exactness', ['--pairs', '3'], 'too small'),
    ('smallem_exactness', ['--proposer', 'oracle', '--pairs', '1000', '--positions', '1000'], 'unknown proposer'),
    ('smallem_bench', ['--proposers', 'oracle'], 'unknown proposer'),
    ('smallem_bench', ['--k', 'two'], 'invalid k'),
    ('smallem_bench', ['--k', '0'], 'bad k'),
    ('smallem_bench', ['--temperature', '-1'], 'temperature'),
    ('smallem_bench', ['--batch', '0'], 'must be >= 1'),
    ('smallem_bench', ['--preset', 'huge'], 'unknown preset'),
    ('smallem_kernels', ['--reps', '1'], 'need --reps'),
    ('smallem_kernels', ['--preset', 'huge'], 'unknown preset'),
    ('smallem_kernels', ['--json', '/nonexistent/dir/k.json'], 'cannot write --json'),
    ('smallem_bench', ['--json', '/nonexistent/dir/b.json'], 'cannot write --json'),
    ('smallem_bench', ['--plot', '/nonexistent/dir/b.png'], 'cannot write --plot'),
])
def test_bad_flags(cmd, args, msg):
    r = run(cmd, *args)
    assert r.returncode == 2, r.stderr
    assert 'Traceback' not in r.stderr and msg in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f'{cmd}: error:')

def test_generate_runs():
    r = run('smallem_generate', '--preset', 'cpu', '--new-tokens', '20')
    assert r.returncode == 0, r.stderr
    assert 'tokens/s' in r.stdout

def test_exactness_command():
    r = run('smallem_exactness', '--pairs', '50000', '--positions', '30000', '--e2e', '0')   # e2e: tests/test_verify.py
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'verdicts as expected' in r.stdout and 'REJECT' in r.stdout   # the controls are rejected
    print(r.stdout)

def test_bench_small(tmp_path):
    j, png = tmp_path/'b.json', tmp_path/'b.png'
    r = run('smallem_bench', '--preset', 'cpu', '--prompts', '2', '--new-tokens', '12', '--k', '1,2,adaptive', '--proposers', 'draft2,mtp,ngram',
            '--temperature', '0,1', '--batch', '1,2', '--json', str(j), '--plot', str(png))
    assert r.returncode == 0, r.stderr[-2000:]
    import json
    rows = json.loads(j.read_text())
    keys = {'proposer', 'k', 'temperature', 'batch', 'tokens_per_s', 'speedup', 'alpha_per_position', 'tokens_per_round', 'predicted_speedup', 'identical'}
    assert all(keys <= set(r) for r in rows)
    assert len(rows) == 2 * 2 * (2 + 3 * 3), len(rows)     # target alone on the fast path and on the reference code, 9 speculative rows
    assert all(r['identical'] for r in rows if r['temperature'] == 0 and not r['proposer'].startswith('none')), "a greedy row differs from the target alone"
    assert {r['path'] for r in rows if r['proposer'] == 'none (reference)'} == {'reference'} and {r['path'] for r in rows if r['proposer'] == 'mtp'} == {'fast'}
    assert png.stat().st_size > 10_000

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
