"Committed checkpoints load fast and are refused when tampered with, truncated or mismatched."
import json, shutil, time
import pytest
from smallem_spec.train import load_checkpoint, load_or_train
from smallem_spec.core import SmallemError, repo_models_dir
from smallem_spec.model import MODEL_NAMES

CPU = repo_models_dir()/'cpu'

def test_committed_models_present_and_small():
    files = [CPU/f'{n}.{e}' for n in MODEL_NAMES for e in ('safetensors', 'json')] + [CPU/'tokenizer.json']
    assert all(f.exists() for f in files), [str(f) for f in files if not f.exists()]
    size = sum(f.stat().st_size for f in CPU.iterdir())
    assert size <= 48 * 2**20, f"models/cpu holds {size/2**20:.1f} MB, over 48 MB"   # the limit of the family issue (16)

@pytest.mark.parametrize('name', MODEL_NAMES)
def test_load_fast(name):
    t0 = time.perf_counter(); m = load_or_train('cpu', name, device='cpu'); dt = time.perf_counter() - t0
    assert dt < 5, f"loading {name} took {dt:.1f} s"
    assert m.manifest['val']['nats_per_byte'] > 0

def test_family_ordering():
    npb = {n: json.loads((CPU/f'{n}.json').read_text())['val']['nats_per_byte'] for n in MODEL_NAMES}
    assert npb['target'] < npb['draft4'] < npb['draft2'], npb

@pytest.fixture
def copy(tmp_path):
    for f in ('target.json', 'target.safetensors'): shutil.copy(CPU/f, tmp_path/f)
    return tmp_path

def test_tampered_weights_refused(copy):
    data = bytearray((copy/'target.safetensors').read_bytes()); data[-100] ^= 0xFF
    (copy/'target.safetensors').write_bytes(bytes(data))
    with pytest.raises(SmallemError, match='do not match their manifest'): load_checkpoint(copy, 'target', 'cpu')

def test_truncated_weights_refused(copy):
    with open(copy/'target.safetensors', 'r+b') as f: f.truncate(4096)
    with pytest.raises(SmallemError, match='do not match their manifest'): load_checkpoint(copy, 'target', 'cpu')

def test_mismatched_config_refused(copy):
    with pytest.raises(SmallemError, match='another configuration'):
        shutil.copy(copy/'target.json', copy/'draft2.json'); shutil.copy(copy/'target.safetensors', copy/'draft2.safetensors')
        load_checkpoint(copy, 'draft2', 'cpu')

def test_other_tokenizer_refused(copy):
    man = json.loads((copy/'target.json').read_text()); man['tokenizer_hash'] = 'f' * 16
    (copy/'target.json').write_text(json.dumps(man))
    with pytest.raises(SmallemError, match='trained with tokenizer'): load_checkpoint(copy, 'target', 'cpu')

def test_corrupt_manifest_refused(copy):
    (copy/'target.json').write_text('{not json')
    with pytest.raises(SmallemError, match='not valid JSON'): load_checkpoint(copy, 'target', 'cpu')
