"""Write README.md from nbs/index.ipynb (nbdev_readme needs Quarto, which these machines lack).
Markdown cells are copied; code cells that are not hidden are shown with their text or markdown outputs, and their
pictures as PNG files under nbs/readme_files/ that the README links to.
`--check` exits 1 when README.md or one of those pictures is not what this script would write."""
import base64, json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIRECTIVES = ('#|',)

FIGS = ROOT/'nbs'/'readme_files'

def render(nb_path=ROOT/'nbs'/'index.ipynb', figs:dict|None=None) -> str:
    "The README's text; the pictures it links to are put in `figs` (file name -> PNG bytes)."
    nb = json.loads(Path(nb_path).read_text()); figs = {} if figs is None else figs
    out = ['<!-- generated from nbs/index.ipynb by tools/readme.py: edit the notebook, not this file -->\n']
    for c in nb['cells']:
        src = ''.join(c['source'])
        lines = src.splitlines()
        if c['cell_type'] == 'markdown': out.append(src.strip() + '\n'); continue
        if any(l.strip() in ('#| hide', '#|hide') for l in lines) or any(l.startswith('#| default_exp') for l in lines): continue
        code = '\n'.join(l for l in lines if not l.startswith(DIRECTIVES)).strip()
        echo = not any(l.strip() == '#| echo: false' for l in lines)
        if code and echo: out.append(f'```python\n{code}\n```\n')
        for o in c.get('outputs', []):
            d = o.get('data', {})
            if 'image/png' in d:
                name = f'figure{len(figs) + 1}.png'; figs[name] = base64.b64decode(''.join(d['image/png']))
                out.append(f'![a figure of the front page](nbs/readme_files/{name})\n')
            elif 'text/markdown' in d: out.append(''.join(d['text/markdown']).strip() + '\n')
            elif o.get('output_type') == 'stream' or 'text/plain' in d:
                t = ''.join(o.get('text') or d.get('text/plain')).rstrip()
                if t: out.append(f'```\n{t}\n```\n')
    return '\n'.join(out)

if __name__ == '__main__':
    figs = {}; text = render(figs=figs); readme = ROOT/'README.md'
    if '--check' in sys.argv:
        same = readme.exists() and readme.read_text() == text and all((FIGS/n).exists() and (FIGS/n).read_bytes() == b for n, b in figs.items())
        sys.exit(0 if same else 1)
    FIGS.mkdir(exist_ok=True)
    for old in FIGS.glob('*.png'):
        if old.name not in figs: old.unlink()
    for n, b in figs.items(): (FIGS/n).write_bytes(b)
    readme.write_text(text); print(f'wrote {readme} and {len(figs)} picture(s) in {FIGS.relative_to(ROOT)}')
