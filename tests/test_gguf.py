"""GGUF export read by llama.cpp (through llama-cpp-python, built from its PyPI source by `tools/setup.sh dev`):
the same ids for the same text, the same logits to rounding and the same greedy text as ours, f32, 8 validation
prompts x 200 tokens, for the cpu target and draft2; and `smallem_export_gguf`'s one-line errors.
A missing llama.cpp is a failure with a one-line reason, never a skip."""
import importlib, os, subprocess, sys, time
import pytest, torch
from smallem_spec.corpus import load_corpus, load_tokenizer, split_corpus

BIN = os.path.dirname(sys.executable)     # the console scripts installed beside this interpreter (.venv/bin)


def need_llama_cpp():
    try: importlib.import_module('llama_cpp'); return
    except ImportError as e: why = str(e)
    pytest.fail(f"llama.cpp's Python binding is missing ({why}): `bash tools/setup.sh dev` builds llama-cpp-python==0.3.36", pytrace=False)


@pytest.fixture(scope='module')
def texts(prompts):
    "The whole validation text, then each validation prompt's text."
    tok = load_tokenizer('cpu')
    return ['\n'.join(v for _, v in sorted(split_corpus(load_corpus())[1].items()))] + [tok.decode(p) for p in prompts]


@pytest.mark.parametrize('name', ['target', 'draft2'])
def test_llama_cpp_parity(name, cpu_models, prompts, texts):
    need_llama_cpp()
    from smallem_spec.hf import gguf_parity
    threads = torch.get_num_threads(); torch.set_num_threads(1)   # a check, not a race: one thread for both engines,
    try:                                                           # so that a busy machine cannot make it crawl
        t0 = time.perf_counter()
        rep = gguf_parity({name: cpu_models[name]}, load_tokenizer('cpu'), prompts, 200, texts)
    finally: torch.set_num_threads(threads)
    r = rep[name]
    print(f"{name}: {time.perf_counter() - t0:.1f} s (llama.cpp decoding {r['llama_cpp_seconds']} s), max |logit diff| "
          f"{r['max_abs_logit_diff']:.2e}, {r['sequences_identical']} sequences identical, {rep['versions']}")
    assert len(prompts) == 8 and r['greedy_tokens'] == 8 * 200
    assert r['greedy_identical'], f"{name}: {r['sequences_identical']} sequences identical, first divergences at {r['first_divergence']}"
    assert r['encoded_tokens'] > 100_000
    assert r['encode_identical'], f"{name}: llama.cpp tokenizes the validation text or a prompt differently"
    assert r['decode_identical'], f"{name}: llama.cpp decodes ids to other text"
    assert r['max_abs_logit_diff'] < 1e-3, r['max_abs_logit_diff']


def run(*args, cwd=None):
    exe = os.path.join(BIN, 'smallem_export_gguf')
    return subprocess.run([exe if os.path.exists(exe) else 'smallem_export_gguf', *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_cli_help():
    r = run('--help')
    assert r.returncode == 0 and '--preset' in r.stdout and '--out' in r.stdout and '--dtype' in r.stdout


GGUF_REFUSED = [
    (['--preset', 'huge', '--out', '{tmp}/m.gguf'], 'unknown preset'),
    (['--preset', 'tiny', '--name', 'draft3', '--out', '{tmp}/m.gguf'], 'unknown model name'),
    (['--preset', 'tiny', '--out', '{tmp}/m.gguf', '--dtype', 'q8'], 'invalid choice'),
    (['--preset', 'tiny', '--out', '{tmp}/f/m.gguf'], 'cannot write the GGUF file'),        # under a file
    (['--preset', 'tiny', '--out', '{tmp}/no/such/m.gguf'], 'cannot write the GGUF file'),  # a missing folder
    (['--preset', 'tiny', '--out', '{tmp}'], 'it is a folder'),
]

@pytest.fixture(scope='module')
def gguf_refused(run_commands, tmp_path_factory):
    "Every line of GGUF_REFUSED in one interpreter, each in its own folder holding one file, f."
    dirs = [tmp_path_factory.mktemp(f'gguf{i}') for i in range(len(GGUF_REFUSED))]
    for d in dirs: (d/'f').write_text('a file')
    return list(zip(run_commands([('smallem_export_gguf', [a.replace('{tmp}', str(d)) for a in args], d) for (args, _), d in zip(GGUF_REFUSED, dirs)]), dirs))

@pytest.mark.parametrize('i', range(len(GGUF_REFUSED)), ids=[m for _, m in GGUF_REFUSED])
def test_cli_errors(gguf_refused, i):
    msg, (r, tmp_path) = GGUF_REFUSED[i][1], gguf_refused[i]
    assert r.rc == 2, r.stderr
    assert 'Traceback' not in r.stderr and msg in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith('smallem_export_gguf: error:')
    assert len(lines) == 1 or lines[0].startswith('usage:'), lines
    assert os.listdir(tmp_path) == ['f'] and (tmp_path/'f').read_text() == 'a file', f"the refused command wrote {os.listdir(tmp_path)}"


def test_cli_writes_a_file(tmp_path):
    import gguf
    r = run('--preset', 'cpu', '--name', 'draft2', '--dtype', 'f16', '--out', str(tmp_path/'d2.gguf'))   # committed: nothing to train
    assert r.returncode == 0, r.stderr
    g = gguf.GGUFReader(tmp_path/'d2.gguf')
    assert g.fields['llama.block_count'].contents() == 2 and g.fields['general.file_type'].contents() == 1
    types = {t.name: t.tensor_type.name for t in g.tensors}
    assert types['blk.0.attn_q.weight'] == 'F16' and types['blk.0.attn_norm.weight'] == 'F32'
    assert 'output.weight' not in types                     # the head is tied: llama.cpp uses token_embd.weight
    assert os.listdir(tmp_path) == ['d2.gguf']              # no temporary file left


def test_q8_0_file_read_by_llama_cpp(tmp_path, cpu_models, prompts):
    "`--dtype q8_0`: matrices in llama.cpp's Q8_0 (the `gguf` package's quantizer), norms f32; llama.cpp loads the file and its"
    " logits are the model's to within what eight bits move them (not to float rounding: Q8_0 for real), its greedy token"
    " the model's at most positions."
    need_llama_cpp()
    import gguf, numpy as np
    from llama_cpp import Llama
    r = run('--preset', 'cpu', '--name', 'target', '--dtype', 'q8_0', '--out', str(tmp_path/'t.gguf'))
    assert r.returncode == 0, r.stderr
    g = gguf.GGUFReader(tmp_path/'t.gguf')
    types = {t.name: t.tensor_type.name for t in g.tensors}
    assert g.fields['general.file_type'].contents() == 7 and types['blk.0.ffn_up.weight'] == 'Q8_0' and types['token_embd.weight'] == 'Q8_0'
    assert types['blk.0.attn_norm.weight'] == 'F32'
    m = Llama(str(tmp_path/'t.gguf'), n_ctx=256, logits_all=True, verbose=False, n_threads=1)
    x = prompts[0][:32]; m.eval(x)
    ours = cpu_models['target'](torch.tensor([x]))[0].detach().numpy()
    theirs = np.array([m.scores[i] for i in range(len(x))])
    d = np.abs(ours - theirs).max()
    assert 1e-3 < d < 1.0, d
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.9
