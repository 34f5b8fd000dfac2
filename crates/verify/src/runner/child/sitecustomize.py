# commstack test runner: marks the end of each multiprocessing child's target (a test's
# ranks) with the test-end sentinel, as the wrapper does for the main process. Only on
# PYTHONPATH under the runner; an existing sitecustomize is still imported.
import os
import sys


def _chain_original():
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        sys.modules["sitecustomize"] = me


def _install(name):
    import ctypes
    import multiprocessing.process as mpp

    original_run = mpp.BaseProcess.run

    def run(self):
        rc = 1
        try:
            original_run(self)
            rc = 0
        except SystemExit as err:
            rc = 0 if err.code is None else (err.code if isinstance(err.code, int) else 1)
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                ctypes.CDLL(None).fflush(None)
            except Exception:  # noqa: BLE001
                pass
            line = "@@commstack: test-end %s/%s rc=%d pid=%d@@\n" % (name, self.name, rc, os.getpid())
            for stream in (sys.stdout, sys.stderr):
                stream.write(line)
                stream.flush()

    mpp.BaseProcess.run = run


_chain_original()
if os.environ.get("COMMSTACK_TEST_NAME"):
    _install(os.environ["COMMSTACK_TEST_NAME"])
