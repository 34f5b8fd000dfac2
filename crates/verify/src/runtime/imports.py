# commstack: import a module as a user would, every warning it raises recorded. Shared
# by verify's runtime probe (probe.py follows it) and the image step's `import torch`
# check (import_check.py follows it): one definition of a clean import.
import importlib
import sys
import traceback
import warnings


# What Python's default warning filters hide outside __main__: a library's deprecation
# notes about its own code (torch 2.11's `torch.jit.script_method` when DeepEP V2 imports
# it) never reach the user who imports it.
HIDDEN_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def import_module(name):
    # Every warning the import raises is recorded: a clean import warns of nothing a user
    # sees, e.g. torch without numpy warns "Failed to initialize NumPy". Those Python's
    # default filters hide are kept apart, reported but not judged.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = import_module_quietly(name)
    shown, hidden = [], []
    for w in caught:
        text = "%s: %s (%s:%s)" % (w.category.__name__, w.message, w.filename, w.lineno)
        (hidden if issubclass(w.category, HIDDEN_BY_DEFAULT) else shown).append(text)
    result["warnings"] = shown
    result["hidden_warnings"] = hidden
    return result


def import_module_quietly(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:
        # Absent only if the module itself is missing, not something it imports.
        if err.name == name:
            return {"module": name, "status": "absent", "error": str(err)}
        return {"module": name, "status": "error", "error": traceback.format_exc()}
    except BaseException:  # noqa: BLE001 - a failing import is a finding, not a crash
        return {"module": name, "status": "error", "error": traceback.format_exc()}
    return {
        "module": name,
        "status": "ok",
        "file": getattr(module, "__file__", None),
        "version": str(getattr(module, "__version__", "") or "") or None,
    }


def torch_facts():
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    facts = {"version": str(torch.__version__), "cuda": getattr(torch.version, "cuda", None)}
    try:
        # The NCCL torch was compiled against, not the one loaded: reported for contrast.
        facts["nccl_compiled"] = list(torch.cuda.nccl.version())
    except Exception as err:  # noqa: BLE001
        facts["nccl_compiled_error"] = str(err)
    return facts


