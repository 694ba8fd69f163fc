#!/usr/bin/env python3
"""The shape of a crate's source, read from its files: the largest files, the longest
functions, and the graph of its modules' imports with any cycles in it.

    scripts/core-structure.py [CRATE_SRC_DIR]      (default: bcl-core/src)

A module is a top-level module of the crate (a file `x.rs` or a folder `x/`); an edge
A -> B is any `crate::B` path in A's code outside its tests (`#[cfg(test)]` blocks, which
may use whatever they test, are left out). Function lengths count the lines from `fn` to
its closing brace.
"""

import os
import re
import sys


def rust_files(root):
    for dirpath, _, names in os.walk(root):
        for n in sorted(names):
            if n.endswith(".rs"):
                yield os.path.join(dirpath, n)


def strip_tests(text):
    """The text without `#[cfg(test)]` items (a `mod tests { ... }` or one function)."""
    out, i = [], 0
    while True:
        at = text.find("#[cfg(test)]", i)
        if at < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:at])
        brace = text.find("{", at)
        semi = text.find(";", at)
        if semi >= 0 and (brace < 0 or semi < brace):
            i = semi + 1
            continue
        depth, j = 0, brace
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        i = j + 1


def without_comments_and_strings(text):
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return text


def top_module(root, path):
    rel = os.path.relpath(path, root)
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def functions(path):
    """(name, first line, lines) of every fn with a body."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found = []
    pattern = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")
    for i, line in enumerate(lines):
        m = pattern.match(line)
        if not m:
            continue
        depth, started = 0, False
        for j in range(i, len(lines)):
            code = without_comments_and_strings(lines[j])
            for ch in code:
                if ch == "{":
                    depth += 1
                    started = True
                elif ch == "}":
                    depth -= 1
            if started and depth == 0:
                found.append((m.group(6), i + 1, j - i + 1))
                break
            if not started and code.rstrip().endswith(";"):
                break
    return found


def cycles(graph):
    """Every elementary cycle's node list, each once (smallest rotation first)."""
    seen, out = set(), []

    def walk(start, node, path):
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                cyc = path[:]
                k = cyc.index(min(cyc))
                key = tuple(cyc[k:] + cyc[:k])
                if key not in seen:
                    seen.add(key)
                    out.append(list(key))
            elif nxt not in path and nxt > start:
                walk(start, nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "bcl-core/src"
    files = list(rust_files(root))
    sizes = sorted(((sum(1 for _ in open(f, encoding="utf-8")), f) for f in files), reverse=True)
    print(f"== largest files of {root} (lines)")
    for n, f in sizes[:8]:
        print(f"{n:6}  {os.path.relpath(f, root)}")
    print(f"== longest functions (lines)")
    fns = sorted(
        ((n, name, os.path.relpath(f, root), line) for f in files for name, line, n in functions(f)),
        reverse=True,
    )
    for n, name, f, line in fns[:10]:
        print(f"{n:6}  {name} ({f}:{line})")
    graph = {}
    for f in files:
        me = top_module(root, f)
        if me in ("lib", "main"):
            continue
        code = without_comments_and_strings(strip_tests(open(f, encoding="utf-8").read()))
        for m in re.finditer(r"\bcrate::(\w+)", code):
            other = m.group(1)
            is_module = os.path.exists(os.path.join(root, other + ".rs")) or os.path.isdir(
                os.path.join(root, other)
            )
            if other != me and is_module:
                graph.setdefault(me, set()).add(other)
    print("== module imports (module -> modules it uses)")
    for m in sorted(set(graph) | {top_module(root, f) for f in files} - {"lib", "main"}):
        print(f"  {m} -> {', '.join(sorted(graph.get(m, ()))) or '(none)'}")
    found = cycles(graph)
    print(f"== import cycles: {len(found)}")
    for c in found:
        print("  " + " -> ".join(c + [c[0]]))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
