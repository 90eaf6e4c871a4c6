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

# The slowest tests first (about their seconds on one worker thread: CI's --durations list of 2026-12-07, and this
# session's for the tests it changed): pytest-xdist hands tests out in collection order, and these sat near its end
# (test_trees, test_verify), where one worker could run them while the other had nothing left. Started first, and
# handed out in small batches (tools/test.sh: --maxschedchunk 1, each worker holding two), they finish while the short
# tests fill in around them.
_SLOW_FIRST = {
    'tests/test_resident.py::test_sampled_law': 150, 'tests/test_verify.py::test_end_to_end_power_one_row_at_a_time[draft2]': 80,
    'tests/test_draft_vocab.py::test_end_to_end_mtp_with_a_draft_vocabulary': 69, 'tests/test_draft_vocab.py::test_end_to_end_draft2_with_a_draft_vocabulary': 64,
    'tests/test_trees.py::test_sampled_law_end_to_end[library]': 64, 'tests/test_distill.py::test_cli_mtp_stage': 62,
    'tests/test_verify.py::test_end_to_end_power_one_row_at_a_time[ngram]': 56, 'tests/test_verify.py::test_end_to_end_power_one_row_at_a_time[draft2_kd]': 54,
    'tests/test_spec.py::test_greedy_identity[self]': 46, 'tests/test_fast.py::test_greedy_identity_fast_path[1]': 44,
    'tests/test_minimal_loop.py::test_sampled_law_test_rejects_planted_bugs[kept with probability p(x)]': 41,
    'tests/test_spec.py::test_greedy_identity[draft2]': 41, 'tests/test_int8.py::test_end_to_end_sampling_int8_target': 40,
    'tests/test_trees.py::test_sampled_law_end_to_end[python]': 64}

def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda it: -_SLOW_FIRST.get(it.nodeid, 0))   # stable: the rest keep their order
