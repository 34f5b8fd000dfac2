# commstack test wrapper: runs one test, then prints the test-end sentinel before the
# interpreter and the libraries tear down, so that what they print afterwards can be
# judged on its own (the exit-clean gate). Run by `commstack_verify::runner`.
#
#   python wrapper.py function NAME FILE:FUNCTION
#   python wrapper.py script NAME FILE [ARGS...]
import ctypes
import importlib.util
import os
import runpy
import sys
import traceback

SENTINEL = "@@commstack: test-end {name} rc={rc} pid={pid}@@"


def flush_everything():
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # C libraries (NCCL) buffer stdout when it is a pipe: flush it so that nothing
        # written during the test lands after the sentinel.
        ctypes.CDLL(None).fflush(None)
    except Exception:  # noqa: BLE001 - best effort; the sentinel matters more
        pass


def mark_end(name, rc):
    flush_everything()
    line = SENTINEL.format(name=name, rc=rc, pid=os.getpid()) + "\n"
    # On both streams: each stream's own order then tells what came after.
    for stream in (sys.stdout, sys.stderr):
        stream.write(line)
        stream.flush()


def exit_code(err):
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)
    return 1


def run_function(target):
    path, _, function = target.rpartition(":")
    path = os.path.abspath(path)
    sys.path.insert(0, os.path.dirname(path))
    module_name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    # Registered by name so that spawned ranks can unpickle functions of the module.
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    result = getattr(module, function)()
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def run_script(path, args):
    path = os.path.abspath(path)
    sys.argv = [path] + args
    sys.path.insert(0, os.path.dirname(path))
    runpy.run_path(path, run_name="__main__")
    return 0


def main():
    mode, name, target = sys.argv[1:4]
    rest = sys.argv[4:]
    try:
        rc = run_function(target) if mode == "function" else run_script(target, rest)
    except SystemExit as err:
        rc = exit_code(err)
    except BaseException:  # noqa: BLE001 - a failing test is a result
        traceback.print_exc()
        rc = 1
    mark_end(name, rc)
    sys.exit(rc)


main()
