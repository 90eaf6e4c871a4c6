"""The course reads as a course: short pages that state the idea and today's result, a picture on each, no history of runs.

Read from the notebooks' markdown and stored outputs (what the docs site shows), not from the rendered HTML:
  - a page of the course proper has at most 3,000 words of markdown, the front page at most 1,200;
  - the appendices (pages whose title starts with "Appendix") come after the course proper in reading order;
  - every page but `00_core` shows at least one picture (a PNG or SVG output, or an image in its markdown);
  - the front page has at most 3 tables and at least one picture;
  - no page retells how figures moved across runs ("the run before", "first version", "issue 14", ...): that history
    lives in `nbs/bench/README.md`.
Each detector is run on a small made-up page that it must reject (a negative control).
"""
import json, re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT/'nbs'
MAX_WORDS, MAX_INDEX_WORDS, MAX_INDEX_TABLES = 3000, 1200, 3

# phrases that tell the story of earlier runs or sessions rather than the idea and the current result
HISTORY = re.compile(r"\b(first version|the run before|an? earlier run|earlier runs|previous run|the last run|"
                     r"issue \d+|session \d+|scratch runs?|noisier hour|used to (?:be|keep|read|carry|run|give)|"
                     r"before the fix|no longer|this time|the version before|runs? committed before)\b", re.I)
EXTERNAL_ISSUE = re.compile(r"\b(?:transformers|vLLM|vllm|llama\.cpp|nbdev|SGLang|mlx-lm)[^.;:]{0,40}issue #\d+", re.I)

def pages() -> list[Path]:
    "index, then nbs/[0-9]*.ipynb by name (the reading order of tools/docs.py)."
    return [NBS/'index.ipynb'] + sorted(p for p in NBS.glob('*.ipynb') if not p.name.startswith(('_', '.')) and p.stem != 'index')

def cells(nb: dict, kind: str) -> list[str]:
    return [''.join(c['source']) if isinstance(c['source'], list) else c['source'] for c in nb['cells'] if c['cell_type'] == kind]

def title(nb: dict) -> str:
    for md in cells(nb, 'markdown'):
        m = re.search(r'^# (.+)$', md, re.M)
        if m: return m.group(1).strip()
    return ''

def is_appendix(nb: dict) -> bool: return title(nb).lower().startswith('appendix')

def words(nb: dict) -> int: return sum(len(md.split()) for md in cells(nb, 'markdown'))

def pictures(nb: dict) -> int:
    n = sum(1 for c in nb['cells'] if c['cell_type'] == 'code' for o in c.get('outputs', [])
            if {'image/png', 'image/svg+xml'} & set(o.get('data', {})))
    return n + sum(len(re.findall(r'!\[[^\]]*\]\(|<img ', md)) for md in cells(nb, 'markdown'))

def tables(nb: dict) -> int:
    "Markdown tables (a header rule line |---|) and HTML tables, in the markdown and in the stored outputs."
    n = sum(len(re.findall(r'^\s*\|?\s*:?-{3,}:?\s*\|', md, re.M)) for md in cells(nb, 'markdown'))
    for c in nb['cells']:
        for o in c.get('outputs', []):
            d = o.get('data', {})
            n += ''.join(d.get('text/html', [])).count('<table') + len(re.findall(r'^\s*\|?\s*:?-{3,}:?\s*\|', ''.join(d.get('text/markdown', [])), re.M))
    return n

def history(nb: dict) -> list[str]:
    out = []
    for md in cells(nb, 'markdown'):
        md = EXTERNAL_ISSUE.sub('', md)                   # another project's issue tracker, cited as a source, is not our history
        out += [md[max(0, m.start()-40):m.end()+20].replace('\n', ' ') for m in HISTORY.finditer(md)]
    return out

def load(p: Path) -> dict: return json.loads(p.read_text(encoding='utf-8'))

def test_pages_are_short():
    long = {p.stem: words(nb) for p in pages() if not is_appendix(nb := load(p)) and words(nb) > (MAX_INDEX_WORDS if p.stem == 'index' else MAX_WORDS)}
    assert not long, f"pages of the course proper over {MAX_WORDS} words of markdown (index: {MAX_INDEX_WORDS}): {long}"

def test_appendices_come_last():
    kinds = [is_appendix(load(p)) for p in pages()]
    assert any(kinds), "no page is marked as an appendix (its title starting with 'Appendix')"
    first = kinds.index(True)
    assert all(kinds[first:]), f"a page of the course proper comes after an appendix: {[p.stem for p, a in zip(pages(), kinds)]}"

def test_a_picture_on_every_page():
    bare = [p.stem for p in pages() if p.stem != '00_core' and pictures(load(p)) == 0]
    assert not bare, f"pages with no picture: {bare}"

def test_front_page():
    nb = load(NBS/'index.ipynb')
    assert tables(nb) <= MAX_INDEX_TABLES, f"the front page has {tables(nb)} tables (at most {MAX_INDEX_TABLES})"
    assert pictures(nb) >= 1, "the front page has no picture"

def test_no_history_of_runs():
    found = {p.stem: h for p in pages() if (h := history(load(p)))}
    assert not found, f"pages retelling earlier runs (move it to nbs/bench/README.md): {found}"

def test_detectors_reject_a_bad_page():
    "Negative controls: a long, picture-less page with four tables and a history phrase is caught by each detector."
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n\n"
    bad = {'cells': [{'cell_type': 'markdown', 'source': "# A page\n" + "word " * 3001},
                     {'cell_type': 'markdown', 'source': table * 4 + "In the run before, the MTP row was faster."},
                     {'cell_type': 'code', 'source': 'print(1)', 'outputs': [{'output_type': 'stream', 'text': '1'}]}]}
    assert words(bad) > MAX_WORDS and pictures(bad) == 0 and tables(bad) == 4
    assert history(bad) and not is_appendix(bad)
    ok = {'cells': [{'cell_type': 'markdown', 'source': "# Appendix A: kernels\nThe filter follows transformers' issue #47932 here."},
                    {'cell_type': 'code', 'source': 'plot()', 'outputs': [{'output_type': 'display_data', 'data': {'image/png': 'iVBOR'}}]}]}
    assert is_appendix(ok) and pictures(ok) == 1 and not history(ok) and tables(ok) == 0
