"Commands: --help works; bad flags give a usage line and a one-line error, never a traceback."
import subprocess, sys, shutil
import pytest

COMMANDS = ['smallem_train', 'smallem_generate', 'smallem_exactness']

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
    r = run('smallem_exactness', '--preset', 'cpu', '--pairs', '50000', '--positions', '30000', '--e2e', '2000')
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'verdicts as expected' in r.stdout and 'REJECT' in r.stdout   # the controls are rejected
    print(r.stdout)
