#!/usr/bin/env python3
"""Validate `cargo xtask deploy render`'s Kubernetes output with validators that are not ours.

- Every pod template (LeaderWorkerSet's, each JobSet Job's) against Kubernetes' published
  OpenAPI schema for one version, by the kubernetes-validate package (strict: unknown
  fields are errors): LWS templates as v1 PodTemplates, JobSet templates as batch/v1 Jobs.
- Every LeaderWorkerSet and JobSet against the openAPIV3Schema of the pinned CRDs in
  crates/deploy/schemas/ (jsonschema; unknown fields refused, as `kubectl apply
  --validate=strict` refuses them).
- Each kustomization.yaml lists files that exist.

A negative control runs first: an unknown field and a wrong type must each be refused by
both validators, so this check cannot pass by validating nothing.

Usage: validate_deploy.py KUBERNETES_VERSION SCHEMAS_DIR RENDER_DIR...
Exit status 0 when everything validates, 1 otherwise (each problem printed).
"""

import copy
import pathlib
import sys

import jsonschema
import kubernetes_validate
import yaml

CRDS = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset.x-k8s.io_leaderworkersets.v0.10.0.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.v0.12.0.yaml",
}


def strict(schema):
    """The schema with unknown properties refused wherever it lists properties and does not
    allow others (x-kubernetes-preserve-unknown-fields, additionalProperties)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_validators(schemas_dir):
    validators = {}
    for (api_version, kind), file in CRDS.items():
        crd = yaml.safe_load((schemas_dir / file).read_text())
        version = api_version.split("/")[1]
        [entry] = [v for v in crd["spec"]["versions"] if v["name"] == version]
        schema = strict(entry["schema"]["openAPIV3Schema"])
        # status is the controller's; metadata is ObjectMeta (checked by the API server).
        schema["properties"].pop("status", None)
        schema["properties"]["metadata"] = {"type": "object"}
        validators[(api_version, kind)] = jsonschema.Draft7Validator(schema)
    return validators


def pod_templates(obj):
    """(what, kubernetes object) pairs to validate with kubernetes-validate."""
    name = obj["metadata"]["name"]
    if obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            if key in lwt:
                yield key, {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": f"{name}-{key.lower()}"},
                    "template": lwt[key],
                }
    elif obj["kind"] == "JobSet":
        for rjob in obj["spec"]["replicatedJobs"]:
            yield f"replicatedJobs[{rjob['name']}]", {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"{name}-{rjob['name']}"},
                "spec": rjob["template"]["spec"],
            }


def problems(obj, k8s_version, validators):
    out = []
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in validators:
        return [f"{key}: not a LeaderWorkerSet or JobSet"]
    for err in validators[key].iter_errors(obj):
        path = "/".join(str(p) for p in err.absolute_path)
        out.append(f"CRD schema: {path}: {err.message}")
    for what, k8s_obj in pod_templates(obj):
        try:
            kubernetes_validate.validate(k8s_obj, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = "/".join(str(p) for p in err.path)
            out.append(f"Kubernetes {k8s_version} schema, {what}: {path}: {err.message}")
    return out


def negative_control(objects, k8s_version, validators):
    """Both validators must refuse a broken copy of the first LWS and JobSet."""
    failures = []
    for obj in objects:
        bad = copy.deepcopy(obj)
        bad["spec"]["notAField"] = 1
        if not any(p.startswith("CRD schema") for p in problems(bad, k8s_version, validators)):
            failures.append(f"{obj['kind']}: an unknown spec field was not refused by the CRD schema")
        bad = copy.deepcopy(obj)
        if obj["kind"] == "LeaderWorkerSet":
            pod = bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
        else:
            pod = bad["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod["containers"][0]["imagePullPolicy"] = 7
        pod["containers"][0]["notAField"] = True
        if not any(p.startswith("Kubernetes") for p in problems(bad, k8s_version, validators)):
            failures.append(f"{obj['kind']}: a broken container was not refused by Kubernetes' schema")
    return failures


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    k8s_version, schemas_dir, dirs = argv[1], pathlib.Path(argv[2]), [pathlib.Path(d) for d in argv[3:]]
    validators = crd_validators(schemas_dir)
    failures, checked, controls = [], 0, {}
    for d in dirs:
        for path in sorted(d.rglob("*.yaml")):
            if path.name == "kustomization.yaml":
                kust = yaml.safe_load(path.read_text())
                for res in kust.get("resources", []):
                    if not (path.parent / res).is_file():
                        failures.append(f"{path}: resource {res} does not exist")
                continue
            for obj in yaml.safe_load_all(path.read_text()):
                if obj is None:
                    continue
                checked += 1
                controls.setdefault(obj.get("kind"), obj)
                failures += [f"{path}: {p}" for p in problems(obj, k8s_version, validators)]
    if not {"LeaderWorkerSet", "JobSet"} <= set(controls):
        failures.append(f"expected at least one LeaderWorkerSet and one JobSet under {dirs}, found {sorted(controls)}")
    failures += negative_control(list(controls.values()), k8s_version, validators)
    for f in failures:
        print(f"FAIL {f}")
    print(f"{checked} object(s) validated against Kubernetes {k8s_version} and the pinned CRDs: {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
