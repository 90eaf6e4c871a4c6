import os, pytest, torch

# tools/test.sh runs the tests on one pytest-xdist worker per core (at most 2): then each worker, and every command a test
# starts, gets one thread (two 2-thread processes on 2 cores run many times slower than one); alone, 2 threads.
_WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
if _WORKERS > 1:
    os.environ['SMALLEM_THREADS'] = os.environ['OMP_NUM_THREADS'] = '1'
torch.set_num_threads(1 if _WORKERS > 1 else min(2, os.cpu_count() or 1))

@pytest.fixture(scope='session')
def cpu_models():
    "The committed cpu-preset family (target, draft2, draft4, and the drafters distilled toward the target), loaded once."
    from smallem_spec.train import load_or_train
    return {n: load_or_train('cpu', n, device='cpu') for n in ('target', 'draft2', 'draft4', 'draft2_kd', 'draft4_kd')}

@pytest.fixture(scope='session')
def prompts():
    from smallem_spec.corpus import validation_prompts
    return validation_prompts('cpu', n=8, length=32)

@pytest.fixture(scope='session')
def run_commands(tmp_path_factory):
    """Run command lines [(command, args, folder), ...] in one fresh interpreter (tests/run_commands.py: each console
    script's entry point, output captured, an escaped exception printed as a traceback with status 1); one result per
    line, with .rc, .stdout, .stderr and .seconds. For the many refused-value tests, which would otherwise pay one
    import of torch each (about 3 s)."""
    import json, subprocess, sys
    from pathlib import Path
    from types import SimpleNamespace
    def run(cases):
        out = tmp_path_factory.mktemp('commands')/'results.json'
        r = subprocess.run([sys.executable, str(Path(__file__).with_name('run_commands.py')), str(out)],
                           input=json.dumps([[c, list(a), str(d)] for c, a, d in cases]), capture_output=True, text=True, timeout=900)
        assert r.returncode == 0 and out.exists(), r.stderr[-3000:]
        return [SimpleNamespace(**x) for x in json.loads(out.read_text())]
    return run
