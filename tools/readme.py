"""Write README.md from nbs/index.ipynb (nbdev_readme needs Quarto, which these machines lack).
Markdown cells are copied; code cells that are not hidden are shown with their text or markdown outputs.
`--check` exits 1 when README.md is not what this script would write."""
import json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIRECTIVES = ('#|',)

def render(nb_path=ROOT/'nbs'/'index.ipynb') -> str:
    nb = json.loads(Path(nb_path).read_text())
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
            if 'text/markdown' in d: out.append(''.join(d['text/markdown']).strip() + '\n')
            elif o.get('output_type') == 'stream' or 'text/plain' in d:
                t = ''.join(o.get('text') or d.get('text/plain')).rstrip()
                if t: out.append(f'```\n{t}\n```\n')
    return '\n'.join(out)

if __name__ == '__main__':
    text = render(); readme = ROOT/'README.md'
    if '--check' in sys.argv:
        sys.exit(0 if readme.exists() and readme.read_text() == text else 1)
    readme.write_text(text); print(f'wrote {readme}')
