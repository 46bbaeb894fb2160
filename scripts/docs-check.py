#!/usr/bin/env python3
"""Checks the documentation's cross-references (CI, `.ci/run`; standard library only).

- Every relative Markdown link in a tracked `*.md` file points at a file of the
  repository, and its `#anchor`, if any, at a heading that exists in the target.
- Every `docs/<name>.md` named in a tracked text file (sources, scripts, configs, docs)
  exists.
- Nothing points outside the repository.
- README.md stays a front page: at most 150 lines.

Exit 0 when all hold; otherwise each problem is printed as `file:line: problem` and the
exit code is 1.
"""

import os
import re
import subprocess
import sys

README_MAX_LINES = 150
TEXT_SUFFIXES = (".md", ".rs", ".py", ".sh", ".toml", ".yml", ".yaml", ".html", ".js")

LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS_MENTION = re.compile(r"\bdocs/([A-Za-z0-9_-]+\.md)\b")
FENCE = re.compile(r"^\s*(```|~~~)")


def tracked(root):
    out = subprocess.run(
        ["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    return [p for p in out.splitlines() if p.endswith(TEXT_SUFFIXES)]


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    inside = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield n, line


def anchors(path, cache={}):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            found = set()
            for _, line in prose_lines(f.read()):
                if line.startswith("#"):
                    base = slug(line.lstrip("#"))
                    # Repeated headings get -1, -2, ... on GitHub.
                    name, k = base, 0
                    while name in found:
                        k += 1
                        name = f"{base}-{k}"
                    found.add(name)
            cache[path] = found
    return cache[path]


def check(root):
    problems = []
    root = os.path.realpath(root)
    for rel in tracked(root):
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if rel.endswith(".md"):
            for n, line in prose_lines(text):
                for m in LINK.finditer(line):
                    link = m.group(1)
                    if re.match(r"[a-z][a-z0-9+.-]*:", link):
                        continue  # http:, https:, mailto:
                    target, _, frag = link.partition("#")
                    full = (
                        os.path.realpath(os.path.join(os.path.dirname(path), target))
                        if target
                        else path
                    )
                    if not (full == root or full.startswith(root + os.sep)):
                        problems.append(f"{rel}:{n}: link outside the repository: {link}")
                    elif not os.path.exists(full):
                        problems.append(f"{rel}:{n}: link to a missing file: {link}")
                    elif frag and full.endswith(".md") and frag not in anchors(full):
                        problems.append(f"{rel}:{n}: link to a missing heading: {link}")
        for n, line in enumerate(text.splitlines(), 1):
            for m in DOCS_MENTION.finditer(line):
                if not os.path.isfile(os.path.join(root, "docs", m.group(1))):
                    problems.append(f"{rel}:{n}: names a missing docs/{m.group(1)}")
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        lines = len(f.read().splitlines())
    if lines > README_MAX_LINES:
        problems.append(f"README.md:{lines}: {lines} lines, more than {README_MAX_LINES}")
    return problems


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"docs-check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("docs-check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
