#!/usr/bin/env python3
"""Keeps the house one-way (CI, `.ci/run`; standard library only).

Reads every `src/**/*.rs`, finds which top-level module (`src/<name>.rs` or
`src/<name>/`) each file belongs to and which other top-level modules it names
(`crate::<name>`, `use crate::{<name>, ...}`, and `super::<name>` from a module's root
file). Unit tests beside the code count: a module and its tests are one.

Fails (exit 1), printing the modules and the files behind each edge, when
- the top-level modules import each other in a cycle, or
- `config` (plain data: the file schema, validation, the runtime values) imports any
  module but the value libraries it is allowed (`CONFIG_MAY_IMPORT`), or
- inside `src/proxy`, a part imports what its place does not allow (`PROXY_MAY_IMPORT`):
  the upstream wing never the client side (`downstream`) nor the forwarding service that
  joins them, and the shared leaves neither wing.

`--graph` prints every module's imports.
"""

import os
import re
import sys
from collections import defaultdict

# What config's values are made of: API labels and text limits (decode), SLO classes (slo).
CONFIG_MAY_IMPORT = {"decode", "slo"}

# Inside src/proxy: what each part may name. A part is a wing folder or a file beside
# them; `mod.rs` (the declarations and re-exports) and `downstream` (the top) may name all.
PROXY_LEAVES = {"wire", "headers", "fds", "limit_metrics", "client_body"}
# `mod`: the plain values proxy/mod.rs defines itself (ConnInfo), nameable by every part.
PROXY_MAY_IMPORT = {
    **{leaf: PROXY_LEAVES | {"mod"} for leaf in PROXY_LEAVES},
    "upstream": PROXY_LEAVES | {"upstream", "mod"},
    # The joins: the forwarding service and the upgrade tunnel, over the upstream wing.
    "forward": PROXY_LEAVES | {"upstream", "mod", "tunnel"},
    "tunnel": PROXY_LEAVES | {"upstream", "mod"},
}
PROXY_PATH = re.compile(r"\bcrate::proxy::(\w+)")
PROXY_GROUP = re.compile(r"\bcrate::proxy::\{", re.S)
PUB_USE = re.compile(r"^pub use ([\w:]+?)::(?:\{([^}]*)\}|(\w+)(?: as (\w+))?);", re.M)

COMMENT = re.compile(r"//[^\n]*")
CRATE_PATH = re.compile(r"\bcrate::(\w+)")
CRATE_GROUP = re.compile(r"\bcrate::\{", re.S)
SUPER_PATH = re.compile(r"\bsuper::(\w+)")


def top_modules(src):
    mods = set()
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if name.endswith(".rs") and name not in ("lib.rs", "main.rs"):
            mods.add(name[:-3])
        elif os.path.isdir(path):
            mods.add(name)
    return mods


def group_heads(text, start):
    """The first path segment of each item of a `crate::{...}` group opening at `start`."""
    depth, i, heads, expect = 1, start, [], True
    while i < len(text) and depth:
        c = text[i]
        if c == "{":
            depth += 1
            expect = False
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 1:
            expect = True
        elif expect and (c.isalpha() or c == "_") and depth == 1:
            m = re.match(r"\w+", text[i:])
            heads.append(m.group(0))
            i += len(m.group(0))
            expect = False
            continue
        i += 1
    return heads


def edges(root):
    src = os.path.join(root, "src")
    mods = top_modules(src)
    found = defaultdict(lambda: defaultdict(set))
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)
            parts = rel.split(os.sep)
            top = parts[0][:-3] if parts[0].endswith(".rs") else parts[0]
            if top not in mods:
                continue
            with open(path, encoding="utf-8") as fh:
                text = COMMENT.sub("", fh.read())
            named = set(CRATE_PATH.findall(text))
            for m in CRATE_GROUP.finditer(text):
                named.update(group_heads(text, m.end()))
            # In a module's root file, `super::` is the crate.
            if len(parts) == 1 or (len(parts) == 2 and parts[1] == "mod.rs"):
                named.update(SUPER_PATH.findall(text))
            for other in named:
                if other in mods and other != top:
                    found[top][other].add(os.path.join("src", rel))
    return mods, found


def cycles(mods, found):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(found[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return out


def proxy_edges(root):
    """Inside src/proxy: (part, named part, file) for every name a file uses that lives in
    another part. `super::` is resolved from the file's place; a type re-exported by
    proxy/mod.rs counts as the part it comes from."""
    base = os.path.join(root, "src", "proxy")
    with open(os.path.join(base, "mod.rs"), encoding="utf-8") as fh:
        mod_text = COMMENT.sub("", fh.read())
    reexported = {}
    for m in PUB_USE.finditer(mod_text):
        origin = m.group(1).split("::")[0]
        names = m.group(2).split(",") if m.group(2) else [m.group(4) or m.group(3)]
        for n in names:
            n = n.strip().split(" as ")[-1].strip()
            if n and n != "self":
                reexported[n] = origin
    parts = set()
    for name in os.listdir(base):
        if name.endswith(".rs") and name != "mod.rs":
            parts.add(name[:-3])
        elif os.path.isdir(os.path.join(base, name)):
            parts.add(name)
    out = []
    for dirpath, _, files in os.walk(base):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, base).split(os.sep)
            part = "mod" if rel == ["mod.rs"] else (rel[0][:-3] if len(rel) == 1 else rel[0])
            with open(path, encoding="utf-8") as fh:
                text = COMMENT.sub("", fh.read())
            named = set(PROXY_PATH.findall(text))
            for m in PROXY_GROUP.finditer(text):
                named.update(group_heads(text, m.end()))
            # `super::` from a file beside the wings, or from a wing's mod.rs, is proxy.
            if len(rel) == 1 or (len(rel) == 2 and rel[1] == "mod.rs"):
                named.update(SUPER_PATH.findall(text))
                for m in re.finditer(r"\bsuper::\{", text):
                    named.update(group_heads(text, m.end()))
            # `super::super::` from a file inside a wing.
            named.update(re.findall(r"\bsuper::super::(\w+)", text))
            for n in named:
                other = n if n in parts else reexported.get(n, "mod" if n[:1].isupper() else None)
                if other and other != part:
                    out.append((part, other, os.path.join("src", "proxy", *rel)))
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mods, found = edges(root)
    if "--graph" in sys.argv[1:]:
        for m in sorted(mods):
            print(f"{m} -> {', '.join(sorted(found[m])) or '(nothing)'}")
    problems = []
    for comp in cycles(mods, found):
        lines = [f"import cycle among top-level modules: {', '.join(comp)}"]
        for a in comp:
            for b in sorted(found[a]):
                if b in comp:
                    lines.append(f"  {a} -> {b}: {', '.join(sorted(found[a][b]))}")
        problems.append("\n".join(lines))
    for b in sorted(set(found["config"]) - CONFIG_MAY_IMPORT):
        problems.append(
            f"config imports {b} ({', '.join(sorted(found['config'][b]))}); config is plain"
            " data: move the type into config, or build the subsystem from its section"
        )
    for part, other, path in sorted(set(proxy_edges(root))):
        allowed = PROXY_MAY_IMPORT.get(part)
        if allowed is not None and other not in allowed:
            problems.append(
                f"proxy: {part} imports {other} ({path}); allowed: {', '.join(sorted(allowed))}"
            )
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
