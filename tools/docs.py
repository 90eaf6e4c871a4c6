"""Build the course site in docs/ from the notebooks, offline and without Quarto.

    python tools/docs.py           # nbs/ -> _proc/ (nbdev) -> _build/ (Sphinx) -> docs/
    python tools/docs.py --check   # exit 1 when a notebook changed since docs/ was built

1. `nbdev.serve.proc_nbs()` processes the notebooks into `_proc/` as `nbdev_docs` would (front matter from the title
   and subtitle, `show_doc` cells executed, export and hidden cells dropped, links to the API). Called from Python it
   does not try to install Quarto, which `nbdev_proc_nbs`/`nbdev_docs` do. Other cells keep their *stored* outputs.
2. The processed notebooks are translated where Quarto and MyST differ (front matter -> title, `#|` cell options ->
   myst-nb tags, Quarto link attributes) into `_build/src/`, with a `conf.py` written from `CONF` below.
3. Sphinx + myst-nb + furo render them into `_build/html/`. Chosen because the three install from PyPI, render these
   notebooks offline in a few seconds, come with built-in client-side search and a clean theme, and render the stored
   outputs (markdown from `show_doc`, PNG plots, HTML tables) without executing anything. Math is typeset in the
   browser by a local MathJax 3 copy (`tools/docs_static/mathjax/`); no page references a CDN or a web font.
4. `_build/html/` is copied to `docs/` with `.nojekyll` and `_sources.json`: the sha256 of every notebook's content
   (cells' types, sources and outputs, not metadata) as it was when the build started. `--check` compares it with
   the notebooks as they are now.

`nbdev_docs` (with Quarto) still works from `nbs/_quarto.yml`, `nbs/nbdev.yml`, `nbs/sidebar.yml` (this script
refreshes the last two as nbdev does); it replaces docs/ with Quarto's site, which has no `_sources.json`, so `--check`
then fails until this script is run again.
"""
import hashlib, json, os, re, shutil, sys, time
from configparser import ConfigParser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS, PROC, BUILD, DOCS = ROOT/'nbs', ROOT/'_proc', ROOT/'_build', ROOT/'docs'
STATIC = ROOT/'tools'/'docs_static'
MANIFEST = DOCS/'_sources.json'
SETTINGS = ConfigParser(); SETTINGS.read(ROOT/'settings.ini')
S = SETTINGS['DEFAULT']
SITE_URL = S['doc_host'].rstrip('/') + '/' + S['doc_baseurl'].strip('/') + '/'   # where nbdev's API links point

def notebooks() -> list:
    "The course in reading order: index, then the numbered notebooks by name; `_scratch.ipynb` is skipped."
    nbs = sorted(p for p in NBS.glob('*.ipynb') if not p.name.startswith(('_', '.')) and p.name != 'index.ipynb')
    return ([NBS/'index.ipynb'] if (NBS/'index.ipynb').exists() else []) + nbs

def nb_hash(path: Path) -> str:
    "sha256 of what the page shows: each cell's type, source and outputs (execution counts and metadata left out)."
    cells = []
    for c in json.loads(path.read_text(encoding='utf-8'))['cells']:
        outs = [{k: v for k, v in o.items() if k not in ('execution_count', 'metadata')} for o in c.get('outputs', [])]
        src = c['source'] if isinstance(c['source'], str) else ''.join(c['source'])
        cells.append([c['cell_type'], src, outs])
    return hashlib.sha256(json.dumps(cells, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

def sources() -> dict: return {p.relative_to(ROOT).as_posix(): nb_hash(p) for p in notebooks()}

def check() -> int:
    "0 when docs/ was built from the notebooks as they are now, else 1 with a one-line reason naming the notebooks."
    if not MANIFEST.exists():
        print(f'docs: {MANIFEST.relative_to(ROOT)} is missing: run python tools/docs.py'); return 1
    built, now = json.loads(MANIFEST.read_text())['notebooks'], sources()
    stale = [nb for nb in now if built.get(nb) != now[nb]]
    gone = [nb for nb in built if nb not in now]
    if stale or gone:
        why = [f'{nb} changed since docs/ was built' if nb in built else f'{nb} has no page yet' for nb in stale]
        why += [f'{nb} was removed but still has a page' for nb in gone]
        print(f'docs: out of date ({"; ".join(why)}): run python tools/docs.py'); return 1
    print(f'docs: up to date with the {len(now)} notebooks'); return 0

# ---------------------------------------------------------------------------------------------------------- Sphinx
CONF = dict(
    project=S['title'], author=S['author'], copyright=S['copyright'], release=S['version'],
    extensions=['myst_nb'],
    nb_execution_mode='off',                 # outputs are the stored ones (and `show_doc`'s, from proc_nbs)
    nb_render_markdown_format='myst',        # so that math in `show_doc` output and other markdown outputs renders
    nb_merge_streams=True,
    myst_enable_extensions=['dollarmath', 'amsmath', 'attrs_inline', 'attrs_block', 'colon_fence'],
    myst_dmath_double_inline=True,           # `$$...$$` inside a paragraph is display math, as in Jupyter and Quarto
    myst_heading_anchors=3,
    suppress_warnings=['myst.header'],       # show_doc writes `###` under `##`: allowed here as in Quarto
    mathjax_path='mathjax/tex-mml-chtml.js', # local copy under _static/, never a CDN
    html_theme='furo', html_title=f"{S['title']}", html_static_path=[str(STATIC)], html_css_files=['smallem.css'],
    html_copy_source=False, html_show_sourcelink=False, html_last_updated_fmt=None,
    html_theme_options=dict(               # furo loads no web font; these only add links (view the notebook on GitHub)
        source_repository=S['git_url'].rstrip('/') + '/', source_branch=S['branch'], source_directory='nbs/',
        top_of_page_buttons=['view']),
    exclude_patterns=[], language='en',
)

DIRECTIVE = re.compile(r'^\s*#\|\s*([\w-]+)\s*(?::\s*(.*?))?\s*$')
CELL_TAGS = {('echo', 'false'): 'remove-input', ('output', 'false'): 'remove-output', ('include', 'false'): 'remove-cell',
             ('hide', None): 'remove-cell', ('code-fold', 'true'): 'hide-input'}
QUARTO_LINK_ATTRS = re.compile(r'\{target="_blank" style="float:right; font-size:smaller"\}')   # show_doc's [source]

def _src(c) -> str: return c['source'] if isinstance(c['source'], str) else ''.join(c['source'])

def _front_matter(cell) -> dict:
    "The YAML of a raw `---` front-matter cell, as nbdev writes it from `# Title` and `> subtitle`, else {}."
    import yaml
    m = re.match(r'\s*---\s*\n(.*?)\n---\s*$', _src(cell), flags=re.S) if cell['cell_type'] == 'raw' else None
    return (yaml.safe_load(m.group(1)) or {}) if m else {}

def show_doc_markdown(md: str) -> str:
    "nbdev's `show_doc` markdown for MyST: a section of class show-doc (CSS draws Quarto's rule), [source] after the title."
    md = re.sub(r'\A\s*---\s*\n', '', md)
    src = re.search(r'^\[source\]\(.*?\)' + QUARTO_LINK_ATTRS.pattern + r'[ \t]*\n', md, flags=re.M)
    if src: md = md.replace(src.group(0), '')
    link = QUARTO_LINK_ATTRS.sub('{.sourcelink}', src.group(0)) if src else ''
    return re.sub(r'^(#{1,6} .*\n)', lambda m: '{.show-doc}\n' + m.group(1) + '\n' + link, md, count=1, flags=re.M)

def translate(nb: dict, stem: str) -> tuple[dict, dict]:
    "A processed notebook as myst-nb reads it. Returns (notebook, front matter)."
    fm, cells = {}, []
    for c in nb['cells']:
        if not fm and (f := _front_matter(c)): fm = f; continue       # Quarto front matter -> title cell below
        if c['cell_type'] == 'raw': continue
        if c['cell_type'] == 'code':
            lines, opts = _src(c).splitlines(), {}
            while lines and (m := DIRECTIVE.match(lines[0])):           # `#| key: value` options leave the source
                opts[m.group(1)] = (m.group(2) or '').strip().lower() or None; lines.pop(0)
            outs = c.get('outputs', [])
            mds = [o.get('data', {}).get('text/markdown') for o in outs]
            if opts.get('output') == 'asis' and opts.get('echo') == 'false' and outs and all(m is not None for m in mds):
                # Quarto puts `asis` markdown (show_doc) into the page itself: its headings are sections, in the TOC
                md = '\n\n'.join(show_doc_markdown(m if isinstance(m, str) else ''.join(m)) for m in mds)
                cells.append(dict(cell_type='markdown', metadata={}, source=md)); continue
            tags = [CELL_TAGS[k, v] for k, v in opts.items() if (k, v) in CELL_TAGS]
            c = dict(c, source='\n'.join(lines), metadata=dict(c.get('metadata', {}), tags=tags))
            if not c['source'].strip() and not outs: continue
        cells.append(c)
    head = f"# {fm.get('title') or stem}\n"
    if fm.get('description'): head += f"\n{{.subtitle}}\n{fm['description']}\n"
    cells.insert(0, dict(cell_type='markdown', metadata={}, source=head))
    for i, c in enumerate(cells): c.setdefault('id', f'docs-{i}')                # nbformat 4.5 wants cell ids
    meta = dict(nb.get('metadata', {}), language_info={'name': 'python', 'pygments_lexer': 'ipython3'})
    meta.setdefault('kernelspec', {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'})
    return dict(nb, cells=cells, metadata=meta, nbformat=4, nbformat_minor=max(nb.get('nbformat_minor', 5), 5)), fm

def _anchor_ids(html: str) -> dict:
    "Map a heading's Quarto anchor (its text in lower case, as nbdev's links use) to the id Sphinx gave its section."
    out = {}
    for sid, text in re.findall(r'<section[^>]* id="([^"]+)">\s*(?:<span id="[^"]*"></span>)?<h\d>(.*?)<a class="headerlink"',
                                html, flags=re.S):
        out.setdefault(re.sub(r'<[^>]+>', '', text).strip().lower(), sid)
    return out

def localize_links(html_dir: Path, pages: dict):
    "Point nbdev's absolute API links (doc_host + output-file) at the local pages and Sphinx's section ids."
    ids = {stem: _anchor_ids((html_dir/f'{stem}.html').read_text(encoding='utf-8')) for stem in pages.values()}
    def repl(m):
        stem = pages.get(m.group(1))
        if stem is None: return m.group(0)
        sid = ids[stem].get((m.group(2) or '').lower())    # no such heading (a private name): link the page
        return f'href="{stem}.html#{sid}"' if sid else f'href="{stem}.html"'
    pat = re.compile(r'href="' + re.escape(SITE_URL) + r'([^"#]+?\.html)(?:#([^"]*))?"')
    for f in html_dir.glob('*.html'):
        t = f.read_text(encoding='utf-8'); n = pat.sub(repl, t)
        if n != t: f.write_text(n, encoding='utf-8')

def build() -> int:
    t0 = time.time()
    hashes = sources()                                   # the notebooks as the build starts
    os.chdir(ROOT)                                       # nbdev finds settings.ini from the working directory
    from nbdev.serve import proc_nbs
    from nbdev.quarto import nbdev_sidebar, refresh_quarto_yml
    refresh_quarto_yml()                                 # keep nbs/nbdev.yml and (unless custom) nbs/sidebar.yml
    if S.get('custom_sidebar', 'False').strip().lower() in ('false', '0', 'no', ''): nbdev_sidebar(force=True)
    proc_nbs(force=True, n_workers=2)                    # -> _proc/: import cells and show_doc cells executed
    t1 = time.time()
    src, html = BUILD/'src', BUILD/'html'
    shutil.rmtree(BUILD, ignore_errors=True); src.mkdir(parents=True)
    nbs, pages, toc_entries, translated = notebooks(), {}, [], {}    # pages: nbdev's output-file -> our page name
    for p in nbs:
        proc = PROC/p.name
        if not proc.exists(): print(f'docs: {p.name} was not processed by nbdev'); return 1
        nb, fm = translate(json.loads(proc.read_text(encoding='utf-8')), p.stem)
        translated[p.stem] = nb
        pages[fm.get('output-file', p.stem + '.html')] = p.stem
        if p.stem != 'index': toc_entries.append(f"{p.stem.split('_')[0]} · {fm.get('title') or p.stem} <{p.stem}>")
    for stem, nb in translated.items():
        if stem == 'index':                               # the sidebar: the course in reading order
            nb['cells'].append(dict(cell_type='markdown', metadata={}, id='docs-toctree',
                                    source='```{toctree}\n:hidden:\n:maxdepth: 1\n\n' + '\n'.join(toc_entries) + '\n```\n'))
        (src/f'{stem}.ipynb').write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding='utf-8')
    (src/'conf.py').write_text('# written by tools/docs.py from its CONF: edit it there\n' +
                               ''.join(f'{k} = {v!r}\n' for k, v in CONF.items()), encoding='utf-8')
    from sphinx.cmd.build import build_main
    rc = build_main(['-b', 'html', '-q', '-E', '-j', '1', '-d', str(BUILD/'doctrees'), str(src), str(html)])
    if rc: print(f'docs: sphinx failed (exit {rc})'); return rc
    localize_links(html, pages)
    shutil.rmtree(DOCS, ignore_errors=True)
    shutil.copytree(html, DOCS, ignore=shutil.ignore_patterns('.buildinfo', '.doctrees', '_sources'))
    (DOCS/'.nojekyll').write_text('')
    MANIFEST.write_text(json.dumps({'built_by': 'tools/docs.py', 'hash': 'sha256 of cells (type, source, outputs)',
                                    'notebooks': hashes}, indent=1) + '\n')
    changed = [nb for nb, h in sources().items() if hashes.get(nb) != h]
    print(f'docs: {len(nbs)} pages in {DOCS.relative_to(ROOT)}/ (nbdev {t1 - t0:.0f} s, sphinx {time.time() - t1:.0f} s)')
    if changed: print(f'docs: warning: {", ".join(changed)} changed during the build: run python tools/docs.py again')
    return 0

if __name__ == '__main__':
    sys.exit(check() if '--check' in sys.argv[1:] else build())
