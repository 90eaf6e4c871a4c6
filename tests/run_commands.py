"""Run many command lines in one interpreter, for the tests of refused values: each console script's entry point is
called with its arguments in its own folder, stdout and stderr captured, as the installed script would run it (an
exception that escapes is printed as the interpreter prints it, a traceback, with exit status 1). One import of torch
instead of one per command line. Reads a JSON list of [command, args, folder]; writes a JSON list of
{rc, stdout, stderr, seconds} to the file named by its argument."""
import contextlib, io, json, os, sys, time, traceback
from importlib.metadata import entry_points

EPS = {e.name: e for e in entry_points(group='console_scripts') if e.name.startswith('smallem_')}

def run(cmd, args, cwd):
    out, err, here, t0 = io.StringIO(), io.StringIO(), os.getcwd(), time.perf_counter()
    sys.argv = [cmd, *args]
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try: raise SystemExit(EPS[cmd].load()(list(args)))       # what the console script does with the return value
            except SystemExit as e:
                rc = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
                if not isinstance(e.code, (int, type(None))): print(e.code, file=sys.stderr)
            except BaseException: traceback.print_exc(); rc = 1
    finally: os.chdir(here)
    return dict(rc=rc, stdout=out.getvalue(), stderr=err.getvalue(), seconds=time.perf_counter() - t0)

if __name__ == '__main__':
    dest = sys.argv[1]                         # read before run() sets sys.argv to each command line
    res = [run(*case) for case in json.load(sys.stdin)]
    with open(dest, 'w') as f: json.dump(res, f)
