#!/usr/bin/env python3
"""Renders a kustomization in this folder without kustomize, for machines that lack it.

Only the features these manifests use: `resources` (files and directories), `labels` (pairs
added to metadata.labels, includeSelectors false), `configMapGenerator` (files; behavior
create/replace; name suffix hash disabled) and `patches` (strategic merge: maps merged,
lists of named items merged by `name`, null deletes). Anything else is an error, so a
manifest using more fails loudly here instead of rendering wrong. deploy/check.sh compares
this output with kustomize's whenever a kustomize is available.

    render.py DIR  ->  the rendered documents as YAML on stdout
"""
import os
import sys

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "labels", "configMapGenerator", "patches"}


def merge(base, patch):
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = merge(out[k], v)
            else:
                out[k] = v
        return out
    if (isinstance(base, list) and isinstance(patch, list)
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        # As kustomize: items new to the list come first, in the patch's order.
        out, new = list(base), []
        for item in patch:
            idx = next((i for i, x in enumerate(out) if x["name"] == item["name"]), None)
            if idx is None:
                new.append(item)
            else:
                out[idx] = merge(out[idx], item)
        return new + out
    return patch


def key(doc):
    return (doc["kind"], doc["metadata"]["name"])


def render(d):
    with open(os.path.join(d, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - SUPPORTED
    if unknown:
        sys.exit(f"render.py: {d}: unsupported kustomization fields {sorted(unknown)}")
    docs = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(d, r))
        if os.path.isdir(p):
            docs.extend(render(p))
        else:
            with open(p) as f:
                docs.extend(x for x in yaml.safe_load_all(f) if x)
    for g in k.get("configMapGenerator", []):
        if not g.get("options", {}).get("disableNameSuffixHash"):
            sys.exit(f"render.py: {d}: configMapGenerator needs disableNameSuffixHash here")
        data = {}
        for name in g["files"]:
            with open(os.path.join(d, name)) as f:
                data[os.path.basename(name)] = f.read()
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]}, "data": data}
        behavior = g.get("behavior", "create")
        existing = [i for i, x in enumerate(docs) if key(x) == key(cm)]
        if behavior == "create" and not existing:
            docs.append(cm)
        elif behavior == "replace" and existing:
            docs[existing[0]]["data"] = data
        else:
            sys.exit(f"render.py: {d}: configMapGenerator {g['name']}: behavior {behavior}")
    for p in k.get("patches", []):
        with open(os.path.join(d, p["path"])) as f:
            patch = yaml.safe_load(f)
        idx = [i for i, x in enumerate(docs) if key(x) == key(patch)]
        if len(idx) != 1:
            sys.exit(f"render.py: {d}: patch {p['path']} matches {len(idx)} resources")
        docs[idx[0]] = merge(docs[idx[0]], patch)
    for lab in k.get("labels", []):
        if lab.get("includeSelectors") or lab.get("includeTemplates"):
            sys.exit(f"render.py: {d}: labels: only metadata labels are supported")
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(lab["pairs"])
    return docs


if __name__ == "__main__":
    yaml.safe_dump_all(render(sys.argv[1]), sys.stdout, sort_keys=True)
