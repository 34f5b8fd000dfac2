# `import MODULE` alone, after imports.py: the image step's check in the image with no GPU
# (the runtime probe needs the driver for deep_ep). Prints one JSON line (the import and,
# for torch, its version and CUDA) and exits 0 when the import was clean, 3 when it warned
# (a clean import warns of nothing), 1 when it failed.
import json


def check(name):
    result = import_module(name)
    print(json.dumps({"import": result, "torch": torch_facts()}))
    if result["status"] != "ok":
        return 1
    return 3 if result["warnings"] else 0


raise SystemExit(check(sys.argv[1]))
