import os, pytest, torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

@pytest.fixture(scope='session')
def cpu_models():
    "The committed cpu-preset family (target, draft2, draft4, and the drafters distilled toward the target), loaded once."
    from smallem_spec.train import load_or_train
    return {n: load_or_train('cpu', n, device='cpu') for n in ('target', 'draft2', 'draft4', 'draft2_kd', 'draft4_kd')}

@pytest.fixture(scope='session')
def prompts():
    from smallem_spec.corpus import validation_prompts
    return validation_prompts('cpu', n=8, length=32)
