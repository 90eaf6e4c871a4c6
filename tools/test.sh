#!/usr/bin/env bash
# The test command: notebooks and library in sync, notebook tests, then pytest (its summary line ends the output).
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
export SMALLEM_HOME=${SMALLEM_HOME:-$PWD/.smallem_home}
fail() { echo "test.sh: $1" >&2; exit 1; }
nbdev_clean
git diff --quiet -- nbs || { git diff --stat -- nbs; fail "nbdev_clean changed the notebooks: run nbdev_clean and commit"; }
nbdev_export
git diff --quiet -- smallem_spec || { git diff --stat -- smallem_spec; fail "smallem_spec/ differs from the notebooks: run nbdev_export and commit"; }
[ -z "$(git status --porcelain -- smallem_spec nbs)" ] || { git status --short -- smallem_spec nbs; fail "untracked or changed files after nbdev_export"; }
python tools/readme.py --check || fail "README.md is not generated from nbs/index.ipynb: run python tools/readme.py"
start=$(date +%s)
# two notebooks at a time, one thread each: two 2-thread processes on 2 cores run many times slower than one
SMALLEM_THREADS=1 OMP_NUM_THREADS=1 nbdev_test --n_workers 2 --timing
echo "nbdev_test: $(( $(date +%s) - start )) s"
# pytest on one worker per core, at most 2 (pytest-xdist; tests/conftest.py gives each worker one thread): about half the
# time of one 2-thread process, since most of a test's time is Python between small products
workers=$(python -c "import os; print(min(2, os.cpu_count() or 1))")
python -m pytest tests -q -p no:cacheprovider -n "$workers" --durations=15 "$@"   # the slowest tests listed before the summary line: what to look at when CI nears its 30 minutes
