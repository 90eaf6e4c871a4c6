"""The course site in docs/, checked in a real browser (headless Chromium) over file:// pages.

docs/ is built by `python tools/docs.py` and committed; this test builds nothing. It checks that docs/ is as new as the
notebooks (`tools/docs.py --check`), then opens the index page, every notebook's page and the search page in
Chromium with every host name unresolvable and a net log, and reads the rendered DOM (`--dump-dom`, after MathJax ran):
  - math: MathJax output (`mjx-container`) on the sampling-rule and cost-model pages, and no page with TeX left untypeset
    or a MathJax error;
  - plots: every <img> exists on disk and was decoded by the browser (naturalWidth > 0, reported by a script added to
    a temporary copy of the page, as the DOM does not hold it), and at least one plot on the whole site;
  - navigation: the sidebar lists the notebooks in reading order, every local link (sidebar, page TOC, prev/next, the
    API links in the text) points to a file that exists and, when it has one, to an id that exists there;
  - no request left the site: no page-initiated request to a non-file URL in the net log (Chromium's own background
    requests, which have no page origin, are told apart by their initiator), and no http(s) URL in a
    src=, a stylesheet/script/font/icon href=, or a CSS url()/@import anywhere in docs/;
  - no page shows a traceback (a notebook saved with an error output);
  - search finds a word of the course.
Each detector is also run on a small page that it must reject (a negative control). Screenshots of the index page and
the sampling-rule page go to test_output/screenshots/.
"""
import importlib.util, json, re, shutil, subprocess, sys, tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT/'docs'
SHOTS = ROOT/'test_output'/'screenshots'
CHROMIUM = next((c for c in ('/usr/bin/chromium', shutil.which('chromium') or '', shutil.which('chromium-browser') or '')
                 if c and Path(c).exists()), None)
MATH_PAGES = ('06_sampling', '09_cost_model')
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason='chromium is not installed (apt-get install -y chromium; .ci/run installs it)')

def notebooks() -> list[str]:
    "Page names in reading order: index, then nbs/[0-9]*.ipynb by name (as tools/docs.py orders them)."
    nbs = sorted(p.stem for p in (ROOT/'nbs').glob('*.ipynb') if not p.name.startswith(('_', '.')) and p.stem != 'index')
    return ['index'] + nbs

# ------------------------------------------------------------------------------------------------------- freshness
def test_docs_fresh():
    r = subprocess.run([sys.executable, 'tools/docs.py', '--check'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"docs/ is older than the notebooks: {(r.stdout + r.stderr).strip()}"

def test_check_names_a_stale_notebook(tmp_path, monkeypatch, capsys):
    "Negative control of --check: a manifest with one notebook's hash changed must fail and name that notebook."
    spec = importlib.util.spec_from_file_location('smallem_docs_tool', ROOT/'tools'/'docs.py')
    docs_tool = importlib.util.module_from_spec(spec); spec.loader.exec_module(docs_tool)
    manifest = {'notebooks': docs_tool.sources()}
    nb = sorted(manifest['notebooks'])[-1]
    manifest['notebooks'][nb] = '0' * 64
    (tmp_path/'_sources.json').write_text(json.dumps(manifest))
    monkeypatch.setattr(docs_tool, 'MANIFEST', tmp_path/'_sources.json')
    assert docs_tool.check() == 1, f"--check passed although the manifest's hash of {nb} is wrong"
    out = capsys.readouterr().out
    assert nb in out and len(out.strip().splitlines()) == 1, f"--check's message should be one line naming {nb}: {out!r}"

# ----------------------------------------------------------------------------------------- static: no external URL
FETCHING_LINK_RELS = {'stylesheet', 'preload', 'prefetch', 'modulepreload', 'icon', 'shortcut', 'apple-touch-icon',
                      'manifest', 'preconnect', 'dns-prefetch'}
CSS_URL = re.compile(r'''(?:url\(\s*['"]?|@import\s+['"])([^'")\s]+)''')

def _external(url: str) -> bool: return bool(re.match(r'(?i)(https?:)?//', url.strip()))

class _Fetches(HTMLParser):
    "URLs that a browser fetches while showing the page (not <a href>, which is only followed when clicked)."
    def __init__(self):
        super().__init__(); self.urls, self._style = [], False                 # [(where, url)]
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.urls += [(f'<{tag} {k}>', a[k]) for k in ('src', 'data', 'poster') if a.get(k)]
        if a.get('srcset'): self.urls += [(f'<{tag} srcset>', u.split()[0]) for u in a['srcset'].split(',') if u.strip()]
        if tag == 'link' and a.get('href') and set((a.get('rel') or '').lower().split()) & FETCHING_LINK_RELS:
            self.urls.append((f'<link rel="{a["rel"]}" href>', a['href']))
        if a.get('style'): self.urls += [(f'<{tag} style> url()', u) for u in CSS_URL.findall(a['style'])]
        self._style = tag == 'style'
    def handle_endtag(self, tag): self._style = False
    def handle_data(self, data):
        if self._style: self.urls += [('<style> url()', u) for u in CSS_URL.findall(data)]

def external_fetches(path: Path) -> list[str]:
    "'where: url' for each URL outside the site that the file makes the browser fetch."
    text = path.read_text(encoding='utf-8', errors='replace')
    if path.suffix == '.css':
        urls = [('url()/@import', u) for u in CSS_URL.findall(re.sub(r'/\*.*?\*/', '', text, flags=re.S))]
    else:
        p = _Fetches(); p.feed(text); urls = p.urls
    return [f'{where}: {u}' for where, u in urls if _external(u)]

def test_static_negative_control(tmp_path):
    (tmp_path/'x.html').write_text('<link rel="stylesheet" href="https://cdn.example.org/a.css"><a href="https://ok.org">'
                                   '<img src="//example.com/x.png"><style>@font-face{src:url(https://f.example/f.woff)}</style>')
    (tmp_path/'x.css').write_text('/* https://comment.org */ a{background:url("data:image/svg+xml;http://www.w3.org/2000/svg")}'
                                  '@import "https://cdn.example.org/b.css";')
    found = external_fetches(tmp_path/'x.html') + external_fetches(tmp_path/'x.css')
    assert len(found) == 4, f"the static scan should find exactly the 4 planted external fetches, found {found}"

def test_no_external_reference_in_files():
    assert (DOCS/'index.html').exists(), "docs/index.html is missing: run python tools/docs.py"
    bad = {str(p.relative_to(ROOT)): u for p in sorted(DOCS.rglob('*')) if p.suffix in ('.html', '.css')
           for u in [external_fetches(p)] if u}
    assert not bad, f"pages would fetch from outside the site: {bad}"

# ------------------------------------------------------------------------------------------------------ the browser
REPORT = '''<script>window.addEventListener('load', function () {
  function report() {
    var imgs = Array.prototype.map.call(document.images, function (i) {
      return {src: i.getAttribute('src'), complete: i.complete, natural_width: i.naturalWidth}; });
    var pre = document.createElement('pre'); pre.id = 'docs-test-report'; pre.hidden = true;
    pre.textContent = JSON.stringify({imgs: imgs}); document.body.appendChild(pre); }
  var p = window.MathJax && window.MathJax.startup && window.MathJax.startup.promise;
  if (p) p.then(report, report); else report(); });</script>'''

def chromium(url: str, tmp: Path, *flags: str, size: str = '1280,900') -> subprocess.CompletedProcess:
    "Headless Chromium on one URL, every host name unresolvable, no background traffic of its own that we can stop."
    profile = tempfile.mkdtemp(dir=tmp)
    cmd = [CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync', f'--user-data-dir={profile}',
           '--virtual-time-budget=30000', '--host-resolver-rules=MAP * ~NOTFOUND', f'--window-size={size}', *flags, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

def page_requests(netlog: Path) -> list[str]:
    "Non-file URLs that a page asked for, from a Chromium net log (the browser's own traffic has no page origin)."
    text = netlog.read_text(errors='replace').rstrip()
    try: log = json.loads(text)
    except json.JSONDecodeError: log = json.loads(text.rstrip(',') + ']}')      # a log cut short on exit
    start = log['constants']['logEventTypes']['URL_REQUEST_START_JOB']
    out = []
    for e in log['events']:
        p = e.get('params') or {}
        if e['type'] != start or 'url' not in p: continue
        from_page = str(p.get('initiator', '')).startswith(('null', 'file')) or 'file://' in str(p.get('network_isolation_key', ''))
        if from_page and not p['url'].startswith(('file:', 'data:', 'blob:')): out.append(p['url'])
    return out

class Dom(HTMLParser):
    "What the tests need from a dumped DOM: ids, links by the navigation block they sit in, math, the report."
    VOID = {'area', 'base', 'br', 'col', 'embed', 'hr', 'img', 'input', 'link', 'meta', 'source', 'track', 'wbr'}
    def __init__(self, html: str):
        super().__init__(); self.stack, self.ids, self.links, self.report = [], set(), [], None
        self.mjx = self.merror = self.tracebacks = 0; self.raw_tex, self._report = [], []
        self.feed(html)
    def _within(self, cls: str) -> bool: return any(cls in c for _, c in self.stack)
    def handle_starttag(self, tag, attrs):
        a = dict(attrs); classes = (a.get('class') or '').split()
        if a.get('id'): self.ids.add(a['id'])
        if tag == 'mjx-container': self.mjx += 1
        if {'output', 'traceback'} <= set(classes): self.tracebacks += 1
        if tag == 'mjx-merror' or 'data-mjx-error' in a: self.merror += 1
        if tag == 'a' and a.get('href') is not None:
            where = next((w for w in ('sidebar-tree', 'toc-tree', 'related-pages', 'sidebar-brand', 'search') if self._within(w)), 'text')
            self.links.append((where, a['href']))
        if tag not in self.VOID: self.stack.append((tag, classes + ([f"#{a['id']}"] if a.get('id') else [])))
    def handle_endtag(self, tag):
        while self.stack:
            t, c = self.stack.pop()
            if '#docs-test-report' in c: self.report = json.loads(''.join(self._report))
            if t == tag: break
    def handle_data(self, data):
        if self._within('#docs-test-report'): self._report.append(data)
        elif self._within('math') and not self._within('mjx-container') and '\\' in data: self.raw_tex.append(data.strip()[:60])

@pytest.fixture(scope='module')
def site(tmp_path_factory):
    "Every page opened in Chromium: {name: (Dom, page-initiated non-file requests)}, from a copy with the report script."
    if CHROMIUM is None: pytest.skip('chromium is not installed')
    assert (DOCS/'index.html').exists(), "docs/index.html is missing: run python tools/docs.py"
    tmp = tmp_path_factory.mktemp('docs_site'); copy = tmp/'docs'
    shutil.copytree(DOCS, copy)
    out = {}
    for name in notebooks() + ['search']:
        page = copy/f'{name}.html'
        assert page.exists(), f"docs/{name}.html is missing: the notebook {name} has no page"
        page.write_text(page.read_text(encoding='utf-8').replace('<head>', '<head>' + REPORT, 1), encoding='utf-8')
        url = page.as_uri() + ('?q=speculative' if name == 'search' else '')
        netlog = tmp/f'{name}.netlog.json'
        r = chromium(url, tmp, '--dump-dom', f'--log-net-log={netlog}')
        assert r.returncode == 0 and '<html' in r.stdout, f"chromium failed on {name}.html (exit {r.returncode}): {r.stderr[-500:]}"
        out[name] = (Dom(r.stdout), page_requests(netlog))
    return out

@needs_chromium
def test_browser_negative_controls(tmp_path):
    "The same detectors on a page that loads from outside, has broken images, untypeset math, a traceback: all must fire."
    page = tmp_path/'bad.html'
    page.write_text('<html><head>' + REPORT + '<link rel="stylesheet" href="http://cdn.example.org/a.css"></head><body>'
                    '<img src="https://example.com/x.png"><img src="missing.png"><span class="math">\\(x\\)</span>'
                    '<div class="output traceback">Traceback</div></body></html>')
    r = chromium(page.as_uri(), tmp_path, '--dump-dom', f'--log-net-log={tmp_path/"n.json"}')
    dom, reqs = Dom(r.stdout), page_requests(tmp_path/'n.json')
    assert sorted(reqs) == ['http://cdn.example.org/a.css', 'https://example.com/x.png'], f"net log detector missed requests: {reqs}"
    assert dom.report and [i['natural_width'] for i in dom.report['imgs']] == [0, 0], f"broken images not reported: {dom.report}"
    assert dom.raw_tex and dom.mjx == 0, f"untypeset math not detected: {dom.raw_tex}"
    assert dom.tracebacks == 1, "the traceback output was not detected"

@needs_chromium
def test_math_rendered(site):
    for name in MATH_PAGES:
        dom, _ = site[name]
        assert dom.mjx > 0, f"{name}.html: no MathJax output (mjx-container): the local MathJax did not run or found no math"
    for name, (dom, _) in site.items():
        assert not dom.raw_tex, f"{name}.html: math left as TeX (not typeset by MathJax): {dom.raw_tex[:3]}"
        assert dom.merror == 0, f"{name}.html: {dom.merror} MathJax error(s) (mjx-merror): bad TeX in the notebook"

@needs_chromium
def test_no_error_output(site):
    bad = {name: dom.tracebacks for name, (dom, _) in site.items() if dom.tracebacks}
    assert not bad, f"pages show tracebacks (notebooks saved with an exception in an output): {bad}"

@needs_chromium
def test_plots_load(site):
    n = 0
    for name, (dom, _) in site.items():
        assert dom.report is not None, f"{name}.html: the page's load event never came (no report from the injected script)"
        for img in dom.report['imgs']:
            src = urlsplit(img['src']).path
            assert (DOCS/unquote(src)).exists(), f"{name}.html: <img src={img['src']!r}>: no such file in docs/"
            assert img['complete'] and img['natural_width'] > 0, f"{name}.html: <img src={img['src']!r}> did not load/decode in the browser"
            n += src.startswith('_images/')
    assert n > 0, "no page of the site shows a plot (_images/*): were the notebooks committed without their outputs?"

def _resolve(page: str, href: str, site) -> str | None:
    "Why a local link is broken, or None."
    if _external(href) or href.startswith(('mailto:', 'javascript:')): return None
    parts = urlsplit(href)
    target = (DOCS/page).parent/unquote(parts.path) if parts.path else DOCS/page
    if not target.exists(): return f"{href}: no file {target.relative_to(DOCS) if target.is_relative_to(DOCS) else target}"
    frag = unquote(parts.fragment)
    if frag and target.suffix == '.html':
        ids = site[target.stem][0].ids if target.stem in site else set(re.findall(r'id="([^"]+)"', target.read_text(encoding='utf-8')))
        if frag not in ids: return f"{href}: no id {frag!r} in {target.name}"
    return None

@needs_chromium
def test_navigation(site):
    order = [urlsplit(h).path.removesuffix('.html') for w, h in site['index'][0].links if w == 'sidebar-tree']
    assert order == notebooks()[1:], f"the sidebar does not list the notebooks in reading order: {order} != {notebooks()[1:]}"
    for name, (dom, _) in site.items():
        nav = [(w, h) for w, h in dom.links if h and not h.startswith('#svg-')]
        assert any(w == 'sidebar-tree' for w, _ in nav), f"{name}.html has no sidebar navigation"
        broken = [f"[{w}] {why}" for w, h in nav if (why := _resolve(f'{name}.html', h, site))]
        assert not broken, f"{name}.html: broken links: {broken}"

@needs_chromium
def test_no_request_left_the_site(site):
    left = {name: reqs for name, (_, reqs) in site.items() if reqs}
    assert not left, f"pages requested URLs outside the site: {left}"

@needs_chromium
def test_search(site):
    hits = [h for w, h in site['search'][0].links if w == 'search']
    assert hits, "search.html?q=speculative found no page: the search index or searchtools.js did not work"

@needs_chromium
def test_screenshots(tmp_path):
    SHOTS.mkdir(parents=True, exist_ok=True)
    for name, size in (('index', '1280,1000'), ('06_sampling', '1280,2400')):
        png = SHOTS/f'{name}.png'; png.unlink(missing_ok=True)
        r = chromium((DOCS/f'{name}.html').as_uri(), tmp_path, f'--screenshot={png}', size=size)
        assert png.exists() and png.stat().st_size > 10_000, f"no screenshot of {name}.html (exit {r.returncode}): {r.stderr[-300:]}"
