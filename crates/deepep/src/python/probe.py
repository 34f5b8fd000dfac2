# commstack-deepep environment probe: what a Python environment holds, without
# importing torch (importing it would load its CUDA libraries and NVSHMEM).
# Prints one line `@@commstack-env@@ <json>` on stdout.
import importlib.metadata
import importlib.util
import json
import os
import sys
import sysconfig

MARK = "@@commstack-env@@"


def torch_version_py():
    # torch/version.py is a plain module of assignments (__version__, cuda, git_version):
    # read it without running torch/__init__.py.
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    if not os.path.isfile(path):
        return {"path": path, "error": "no torch/version.py"}
    scope = {}
    try:
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), scope)
    except Exception as err:  # noqa: BLE001 - reported, not fatal
        return {"path": path, "error": repr(err)}
    return {"path": path, "version": str(scope.get("__version__")), "cuda": scope.get("cuda")}


def dists():
    out = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        path = getattr(dist, "_path", None)
        out.append({
            "name": name,
            "version": dist.version,
            "dist_info": str(path) if path is not None else None,
            "requires": dist.requires or [],
        })
    return out


def main():
    paths = sysconfig.get_paths()
    result = {
        "schema": 1,
        "executable": sys.executable,
        "version": "%d.%d.%d" % sys.version_info[:3],
        "implementation": sys.implementation.name,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "sys_path": [p for p in sys.path if p],
        "paths": {k: paths.get(k) for k in ("purelib", "platlib", "scripts", "data", "include")},
        "dists": dists(),
        "torch": torch_version_py(),
        "pip": importlib.util.find_spec("pip") is not None,
    }
    sys.stdout.write(MARK + " " + json.dumps(result) + "\n")


main()
