"""Fill a notebook's outputs in place, skipping the cells flagged `#| slow`, `#| cuda` or `#| eval: false`
(and the tail cell that calls `nbdev_export()`), from the notebook's folder as `nbdev_test` runs it.

    python tools/run_nb.py nbs/05_greedy.ipynb [more.ipynb ...] [--all]

Cells that are skipped keep their stored outputs (a `#| slow` cell's come from a full run, as DESIGN.md says), the
others are executed in order in one IPython shell (execnb, as `nbdev_test` does) and get fresh outputs. `--all` runs
the slow cells too; `--slow=16,17` runs those slow cells (by index in the notebook, as the error messages count them)
and skips the other slow ones (one notebook at a time). `--keep=44,75` runs those cells (later cells may need what
they define) but keeps their stored outputs: live timings whose prose names the machine they came from. The notebook is written only if no cell raised; the first error is printed with its cell's number.
Run `nbdev_clean` afterwards, as the test command checks that the notebooks are clean.
"""
import os, re, sys, time
from pathlib import Path
from execnb.nbio import read_nb, write_nb
from execnb.shell import CaptureShell

FLAGS = re.compile(r'^#\|\s*(slow|cuda|eval:\s*false)\b', re.M)

def run(path: Path, run_slow: bool | set = False, keep: set = frozenset()) -> bool:
    path = path.resolve(); nb = read_nb(path); here = os.getcwd(); os.chdir(path.parent)   # cells read paths relative to nbs/, as nbdev_test runs them
    try: return _run(path, nb, run_slow, keep)
    finally: os.chdir(here)

def _run(path, nb, run_slow, keep=frozenset()) -> bool:
    sh = CaptureShell(mpl_format='png'); sh.set_path(path.parent); t0 = time.time()   # plain PNGs: retina ones take about four times the bytes
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != 'code': continue
        m = FLAGS.search(cell.source)
        if m and not (m.group(1) == 'slow' and (run_slow is True or (isinstance(run_slow, set) and i in run_slow))): continue
        if 'nbdev_export()' in cell.source: continue          # the tail cell: export with nbdev_export, not while other notebooks are half-edited
        stored = (cell.outputs, cell.get('execution_count')) if i in keep else None
        sh.cell(cell)
        if stored: cell.outputs, cell.execution_count = stored
        if sh.exc:
            print(f"{path}: cell {i} raised {type(sh.exc).__name__}: {sh.exc}\n--- its source:\n{cell.source[:800]}", file=sys.stderr)
            return False
    write_nb(nb, path); print(f"{path}: outputs written ({time.time()-t0:.0f} s)"); return True

if __name__ == '__main__':
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    if not args: sys.exit(__doc__)
    some = [a.split('=', 1)[1] for a in sys.argv[1:] if a.startswith('--slow=')]
    kept = [a.split('=', 1)[1] for a in sys.argv[1:] if a.startswith('--keep=')]
    if (some or kept) and len(args) != 1: sys.exit("--slow=... and --keep=... name cells of one notebook: give one notebook")
    keep = {int(i) for i in kept[0].split(',')} if kept else set()
    slow = {int(i) for i in some[0].split(',')} if some else '--all' in sys.argv
    ok = all([run(Path(a), slow, keep) for a in args])
    sys.exit(0 if ok else 1)
