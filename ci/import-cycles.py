#!/usr/bin/env python3
"""Fails when the top-level modules of a crate import each other in a circle.

For every crate under crates/, each source file belongs to a top-level module
(src/foo.rs and src/foo/** are `foo`; lib.rs and main.rs belong to none). A
path `crate::bar…` written in a file of `foo` (in a `use`, or inline) is an
import foo -> bar. Circles among those edges (strongly connected components of
two or more modules) are printed with the lines that close them, and the
script exits 1. Test-only code counts too: a floor that a test reaches back
through is still a circle a reader has to follow.

    python3 ci/import-cycles.py            # every crate
    python3 ci/import-cycles.py hetero     # one crate
    python3 ci/import-cycles.py --graph    # also print every edge
    python3 ci/import-cycles.py --except hetero   # report hetero's, fail on the others
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
# `crate::name` and grouped `crate::{a, b::c}` (one level of braces).
PATH = re.compile(r"\bcrate::(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")
COMMENT = re.compile(r"//.*$")


def module_of(rel):
    parts = rel.split(os.sep)
    if len(parts) == 1:
        name = parts[0][:-3]
        return None if name in ("lib", "main") else name
    return parts[0]


def reexports(src):
    """Names the crate root re-exports from its own modules (`pub use m::{A, B}`):
    `crate::A` in a module is an import of `m`."""
    names = {}
    for root in ("lib.rs", "main.rs"):
        path = os.path.join(src, root)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        for m in re.finditer(r"pub(?:\([^)]*\))?\s+use\s+([A-Za-z_][A-Za-z0-9_]*)::(.*?);", text, re.S):
            module, rest = m.group(1), m.group(2)
            rest = re.sub(r"\s+", "", rest)
            items = rest[1:-1].split(",") if rest.startswith("{") else [rest]
            for item in items:
                leaf = item.split("::")[-1].strip("{}")
                if " as " in item:
                    leaf = item.split(" as ")[-1]
                if leaf:
                    names[leaf] = module
    return names


def edges_of(src):
    alias = reexports(src)
    edges = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)
            me = module_of(rel)
            if me is None:
                continue
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            # Join `use` statements split over lines so braces are seen whole.
            lineno = 0
            for line in text.split("\n"):
                lineno += 1
                code = COMMENT.sub("", line)
                for m in PATH.finditer(code):
                    target = m.group(1)
                    names = (
                        [t.strip().split("::")[0] for t in target[1:-1].split(",")]
                        if target.startswith("{")
                        else [target]
                    )
                    for n in names:
                        n = alias.get(n, n)
                        if n and n != me and n not in ("self", "super"):
                            edges.setdefault((me, n), []).append(f"{rel}:{lineno}")
            # Multi-line `use crate::{` groups.
            for m in re.finditer(r"use\s+crate::\{(.*?)\};", text, re.S):
                body = re.sub(r"\{[^{}]*\}", "", m.group(1))
                for t in body.split(","):
                    n = t.strip().split("::")[0]
                    n = alias.get(n, n)
                    if n and n != me and n not in ("self", "super"):
                        at = text[: m.start()].count("\n") + 1
                        edges.setdefault((me, n), []).append(f"{rel}:{at}")
    return edges


def components(nodes, edges):
    """Tarjan's strongly connected components."""
    graph = {n: sorted({b for (a, b) in edges if a == n}) for n in nodes}
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return [c for c in out if len(c) > 1]


def main():
    argv = sys.argv[1:]
    excepted = set()
    while "--except" in argv:
        i = argv.index("--except")
        excepted.add(argv[i + 1])
        del argv[i : i + 2]
    args = [a for a in argv if not a.startswith("--")]
    show = "--graph" in argv
    crates = args or sorted(os.listdir(ROOT))
    bad = 0
    for c in crates:
        src = os.path.join(ROOT, c, "src")
        if not os.path.isdir(src):
            continue
        edges = edges_of(src)
        nodes = {m for e in edges for m in e}
        # Only modules that exist (a `crate::Name` re-export from lib.rs is not one).
        real = {module_of(os.path.relpath(os.path.join(dp, f), src))
                for dp, _, fs in os.walk(src) for f in fs if f.endswith(".rs")}
        edges = {k: v for k, v in edges.items() if k[1] in real}
        nodes = {m for e in edges for m in e}
        circles = components(nodes, edges)
        print(f"{c}: {len(real - {None})} top-level modules, {len(circles)} import circle(s)")
        if show:
            for (a, b), at in sorted(edges.items()):
                print(f"  {a} -> {b}  ({at[0]}{', …' if len(at) > 1 else ''})")
        if circles and c in excepted:
            print(f"  (not failing: {c} is excepted; its modules still form these circles)")
        for comp in circles:
            bad += c not in excepted
            members = set(comp)
            print(f"  circle: {' <-> '.join(comp)}")
            for (a, b), at in sorted(edges.items()):
                if a in members and b in members:
                    print(f"    {a} -> {b}: {', '.join(at[:3])}{' …' if len(at) > 3 else ''}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
