"""Interop with transformers: the exported checkpoints load with AutoModelForCausalLM / AutoTokenizer in a fresh
process (no custom code) and compute what ours compute: logits to fp32 rounding, greedy text token for token, tokenizer
ids both ways. Plus the export files, the command's errors, and smoke runs of the peer benchmark."""
import json, subprocess
import pytest, torch
from safetensors.torch import load_file
from smallem_spec.corpus import load_tokenizer, validation_prompts, load_corpus, split_corpus
from smallem_spec.model import MODEL_NAMES
from smallem_spec.train import load_or_train
from smallem_spec.core import SmallemError
from smallem_spec.hf import export_hf, hf_parity, peer_bench, format_peer_table, llama_bin, bench_main

transformers = pytest.importorskip('transformers')
LOGIT_TOL = 1e-4


def test_export_files(tmp_path):
    m = load_or_train('tiny', 'target', progress=False)
    d = export_hf(m, load_tokenizer('tiny'), tmp_path/'target')
    assert {'config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json'} <= {f.name for f in d.iterdir()}
    c = json.loads((d/'config.json').read_text())
    assert c['architectures'] == ['LlamaForCausalLM'] and c['tie_word_embeddings'] is True
    assert c['num_key_value_heads'] == c['num_attention_heads'] == m.cfg.n_heads
    assert (c['max_position_embeddings'], c['rms_norm_eps'], c['rope_theta']) == (m.cfg.max_seq_len, m.cfg.norm_eps, m.cfg.rope_theta)
    assert c['hidden_act'] == 'silu' and not c['attention_bias'] and not c['mlp_bias']
    sd = load_file(str(d/'model.safetensors'))
    assert not any(s in k for k in sd for s in ('mtp', 'bias', 'lm_head'))          # no module, no biases, head tied
    assert sum(t.numel() for t in sd.values()) == m.n_params(mtp=False)
    assert {t.dtype for t in sd.values()} == {torch.float32}
    D, F = m.cfg.dim, m.cfg.ffn_dim
    wqkv, w13 = m.layers[1].attn.wqkv.weight, m.layers[1].ffn.w13.weight
    for i, n in enumerate(('q_proj', 'k_proj', 'v_proj')):
        assert torch.equal(sd[f'model.layers.1.self_attn.{n}.weight'], wqkv[i * D:(i + 1) * D])
    assert torch.equal(sd['model.layers.1.mlp.gate_proj.weight'], w13[:F]) and torch.equal(sd['model.layers.1.mlp.up_proj.weight'], w13[F:])
    t = json.loads((d/'tokenizer_config.json').read_text())
    assert t['tokenizer_class'] == 'PreTrainedTokenizerFast' and t['eos_token'] == t['bos_token'] == t['unk_token'] == '<|endoftext|>'
    h = export_hf(m, load_tokenizer('tiny'), tmp_path/'half', torch.float16)
    assert {x.dtype for x in load_file(str(h/'model.safetensors')).values()} == {torch.float16}
    assert json.loads((h/'config.json').read_text())['torch_dtype'] == 'float16'


@pytest.fixture(scope='module')
def cpu_parity():
    "All four committed cpu models, exported and reloaded by transformers in one fresh process."
    models = {n: load_or_train('cpu', n, device='cpu') for n in MODEL_NAMES}
    val = [v for _, v in sorted(split_corpus(load_corpus())[1].items())]
    return hf_parity(models, load_tokenizer('cpu'), validation_prompts('cpu', n=8, length=32), 200, val)


@pytest.mark.parametrize('name', MODEL_NAMES)
def test_logits_match(cpu_parity, name):
    r = cpu_parity[name]
    assert r['model_class'] == 'LlamaForCausalLM'
    assert r['max_abs_logit_diff'] < LOGIT_TOL, f"{name}: max |logit difference| {r['max_abs_logit_diff']:.3e}"


@pytest.mark.parametrize('name', MODEL_NAMES)
def test_greedy_identical(cpu_parity, name):
    r = cpu_parity[name]
    assert r['greedy_tokens'] == 8 * 200
    assert r['greedy_identical'], f"{name}: {r['sequences_identical']} sequences identical, first divergences at {r['first_divergence']}"


def test_tokenizer_identical(cpu_parity):
    for name in MODEL_NAMES:
        r = cpu_parity[name]
        assert r['encoded_tokens'] > 100_000
        assert r['encode_identical'] and r['decode_identical'], name


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=600)


def test_cli_help():
    r = run('smallem_export_hf', '--help')
    assert r.returncode == 0 and '--preset' in r.stdout and '--out' in r.stdout


HF_REFUSED = [
    (['--preset', 'huge'], 'new', 'unknown preset'),
    (['--preset', 'tiny', '--name', 'draft3'], 'new', 'unknown model name'),
    (['--preset', 'tiny', '--dtype', 'int8'], 'new', 'invalid choice'),
    (['--preset', 'tiny'], 'under_a_file', 'cannot write'),
    (['--preset', 'tiny'], 'a_file', 'not a folder'),
]

@pytest.fixture(scope='module')
def hf_refused(run_commands, tmp_path_factory):
    "Every line of HF_REFUSED in one interpreter; each folder holds an empty file, a_file."
    cases = []
    for args, out, _ in HF_REFUSED:
        d = tmp_path_factory.mktemp('hf'); f = d/'a_file'; f.write_text('')
        cases.append(('smallem_export_hf', [*args, '--out', str({'new': d/'out', 'under_a_file': f/'sub', 'a_file': f}[out])], d))
    return run_commands(cases)

@pytest.mark.parametrize('i', range(len(HF_REFUSED)), ids=[f'{o}-{m}' for _, o, m in HF_REFUSED])
def test_cli_errors(hf_refused, i):
    msg, r = HF_REFUSED[i][2], hf_refused[i]
    assert r.rc == 2, r.stderr
    assert 'Traceback' not in r.stderr and msg in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith('smallem_export_hf: error:')


def test_cli_writes_a_loadable_checkpoint(tmp_path):
    r = run('smallem_export_hf', '--preset', 'tiny', '--name', 'draft2', '--out', str(tmp_path/'d2'))
    assert r.returncode == 0, r.stderr
    c = json.loads((tmp_path/'d2'/'config.json').read_text())
    assert c['num_hidden_layers'] == 2


SMOKE_ROWS = (('plain, reference code', 'none', None), ('plain', 'none', None), ('mtp_v256', 'mtp_v256', 2),
              ('draft2', 'draft2', 'adaptive'), ('ngram', 'ngram', 'heuristic'))

def test_peer_bench_smoke():
    "transformers and ours on the tiny family: every greedy row writes our plain text, tokens and passes are counted."
    res = peer_bench('tiny', n_prompts=1, new_tokens=8, repeats=1, temperatures=(0.0,), engines=('transformers', 'ours'),
                     assistant_tokens=(2,), lookup_tokens=(2,), our_rows=SMOKE_ROWS, progress=False)
    rows = res['rows']
    assert len(rows) == 4 + len(SMOKE_ROWS) and 'ours / transformers: plain' in format_peer_table(res)
    assert all(r['same_as_plain'] for r in rows), [(r['engine'], r['method'], r['k']) for r in rows if not r['same_as_plain']]
    assert all(r['tokens'] == 8 for r in rows)
    assert all(1 <= r['tokens_per_pass'] <= 3 for r in rows)          # k <= 2 here: at most 3 tokens a pass
    assert res['meta']['cpu']['model'] and res['meta']['pass_ms']['ours'] > 0


def test_peer_bench_refuses_bad_engines(tmp_path, monkeypatch):
    "An unknown engine, or llama.cpp's tools missing: a one-line error before any work."
    with pytest.raises(SmallemError, match='unknown engine'): peer_bench('tiny', engines=('vllm',))
    monkeypatch.setenv('SMALLEM_LLAMA_BIN', str(tmp_path))
    with pytest.raises(SmallemError, match='build_llama.sh'): peer_bench('tiny', engines=('llama.cpp',))


def test_peer_bench_llama_rows():
    "llama.cpp's tools on the cpu family (where tools/build_llama.sh has built them): greedy text is ours, guesses are counted."
    try: llama_bin()
    except SmallemError as e: pytest.skip(str(e))
    res = peer_bench('cpu', n_prompts=1, new_tokens=64, repeats=1, temperatures=(0.0,), engines=('llama.cpp',),
                     assistant_tokens=(2,), lookup_tokens=(2,), progress=False)
    rows = {r['method']: r for r in res['rows']}
    assert set(rows) == {'plain', 'speculative, draft2', 'prompt lookup'}
    assert all(r['same_as_plain'] for r in rows.values()), rows
    assert rows['plain']['tokens_per_pass'] == 1 and rows['speculative, draft2']['tokens_per_pass'] > 1.3
    assert 0 < rows['speculative, draft2']['acceptance'] <= 1 and res['meta']['pass_ms']['llama.cpp'] > 0


@pytest.mark.parametrize('argv, msg', [(['--peers', '--preset', 'tiny', '--engines', 'vllm'], 'unknown engine'),
                                       (['--peers', '--json', '/nonexistent/dir/x.json'], 'cannot write --json')])
def test_smallem_bench_peers_bad_values(argv, msg, capsys):
    "`smallem_bench --peers` refuses bad values in one line, exit 2, before any work."
    with pytest.raises(SystemExit) as e: bench_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and msg in err[0], err
