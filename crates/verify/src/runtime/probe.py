# commstack runtime probe: import the stack as a user would, then report what the
# process really mapped. Run by `commstack_verify::runtime::probe` after imports.py (its
# import_module and torch_facts); prints one line `@@commstack-probe@@ <json>` on stdout
# (the imports may print anything else).
#
# Argument: the modules to import, comma-separated, in order (default "torch,deep_ep").
# A module that is not installed is reported "absent", never as imported.
import ctypes
import json
import os
import sys

MARK = "@@commstack-probe@@"


def mapped_paths(maps):
    paths = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            path = parts[5]
            if path.endswith(" (deleted)"):
                path = path[: -len(" (deleted)")]
            if path not in paths:
                paths.append(path)
    return paths


def nccl_version(path):
    # dlopen of a library already mapped returns the same handle: this asks the loaded NCCL.
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError as err:
        return {"path": path, "error": "not loaded under this name: %s" % err}
    try:
        get = lib.ncclGetVersion
    except AttributeError:
        return {"path": path, "error": "no ncclGetVersion symbol"}
    version = ctypes.c_int(0)
    rc = get(ctypes.byref(version))
    if rc != 0:
        return {"path": path, "error": "ncclGetVersion returned %d" % rc}
    return {"path": path, "code": version.value}


def main():
    names = [n for n in (sys.argv[1] if len(sys.argv) > 1 else "torch,deep_ep").split(",") if n]
    imports = [import_module(n) for n in names]
    with open("/proc/self/maps") as f:
        maps = f.read()
    nccl = [
        nccl_version(p)
        for p in mapped_paths(maps)
        if os.path.basename(p) == "libnccl.so" or os.path.basename(p).startswith("libnccl.so.")
    ]
    result = {
        "schema": 1,
        "python": {"executable": sys.executable, "version": sys.version.split()[0], "prefix": sys.prefix},
        "imports": imports,
        "torch": torch_facts(),
        # These change what the loader picks; shown beside the findings they explain.
        "env": {k: os.environ[k] for k in ("LD_LIBRARY_PATH", "LD_PRELOAD", "NVSHMEM_DIR", "NCCL_HOME") if k in os.environ},
        "maps": maps,
        "nccl": nccl,
    }
    sys.stdout.write(MARK + " " + json.dumps(result) + "\n")
    sys.stdout.flush()


main()
