#!/usr/bin/env python3
"""The house rules a compiler does not check, over every crate's `src/`:

* no import cycle between files: a file never uses (directly or through others) a file that
  uses it back (`use` paths and inline `crate::`/`super::` paths, test modules left out;
  a `mod.rs` that only declares or re-exports its children is not an edge back);
* no function longer than 80 lines outside test modules;
* no declared dependency that no source, test or bench of its package names (and no
  workspace dependency that no member declares). A dependency kept for its features alone
  is listed, with the reason, under `[package.metadata.house-check] features-only`.

Prints each cycle and each long function with its file and line; exits 1 when there is one.
Usage: python3 tools/house_check.py [--max-fn-lines N]
"""
import argparse
import glob
import tomllib
import os
import re
import sys

CRATES = {"oxalign_kernels": "kernels/src", "oxalign_models": "models/src",
          "oxalign_data": "data/src", "oxalign_rlhf": "rlhf/src",
          "oxalign_actors": "actors/src", "oxalign": "src"}


def blank(text):
    """`text` with comments removed and string and char literals emptied, in one pass."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "r" and re.match(r'r#*"', text[i:i + 8]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r"r(#*)", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^'\\])'", text[i:i + 4]):
            m = re.match(r"'(\\[^']*|[^'\\])'", text[i:])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip(text):
    """The code without comments, strings and `#[cfg(test)]` items."""
    text = blank(text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def module_of(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def file_of(root, parts):
    """The file of the longest prefix of module path `parts` under `root`."""
    for n in range(len(parts), -1, -1):
        base = os.path.join(root, *parts[:n])
        for cand in ([base + ".rs", os.path.join(base, "mod.rs")] if n else
                     [os.path.join(root, "lib.rs"), os.path.join(root, "main.rs")]):
            if os.path.isfile(cand):
                return cand
    return None


def use_paths(code):
    """Every path a file names: `use` trees flattened, and inline `crate::`/`super::` paths."""
    paths = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        paths += flatten(m.group(1).replace("\n", " "))
    paths += re.findall(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", code)
    return paths


def flatten(tree):
    tree = tree.strip()
    m = re.match(r"^(.*?)::\{(.*)\}$", tree, flags=re.S)
    if not m:
        return [re.sub(r"\s+as\s+\w+$", "", tree)]
    prefix, inner = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur); cur = ""; continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    items.append(cur)
    out = []
    for it in filter(None, (x.strip() for x in items)):
        out += [prefix if p == "self" else f"{prefix}::{p}" for p in flatten(it)]
    return out


def resolve(root, mod, path, crate_roots):
    parts = path.split("::")
    if parts[0] in crate_roots:  # another crate of the workspace: not an edge inside this one
        return None
    if parts[0] == "crate":
        parts = parts[1:]
    elif parts[0] == "self":
        parts = mod + parts[1:]
    elif parts[0] == "super":
        base = list(mod)
        while parts and parts[0] == "super":
            base, parts = base[:-1], parts[1:]
        parts = base + parts
    else:
        return None
    return file_of(root, parts)


def edges(root):
    graph = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if not name.endswith(".rs") or name == "tests.rs" or name.endswith("_tests.rs"):
                continue
            path = os.path.join(dirpath, name)
            code = strip(open(path, encoding="utf-8").read())
            mod = module_of(root, path)
            targets = set()
            for p in use_paths(code):
                t = resolve(root, mod, p, CRATES)
                if t and t != path:
                    targets.add(t)
            if name in ("mod.rs", "lib.rs", "main.rs"):
                # a folder's index names its children to declare or re-export them: not a use
                here = os.path.dirname(path)
                targets = {t for t in targets if os.path.dirname(t) != here
                           and os.path.dirname(os.path.dirname(t)) != here}
            graph[path] = targets
    return graph


def cycles(graph):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def long_functions(root, limit):
    found = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            if not name.endswith(".rs") or name == "tests.rs" or name.endswith("_tests.rs"):
                continue
            path = os.path.join(dirpath, name)
            code = strip(open(path, encoding="utf-8").read())
            for m in re.finditer(r"\bfn\s+(\w+)[^;{]*\{", code):
                depth, j = 1, m.end()
                while j < len(code) and depth:
                    depth += {"{": 1, "}": -1}.get(code[j], 0)
                    j += 1
                lines = code[m.start():j].count("\n") + 1
                if lines > limit:
                    line = code[:m.start()].count("\n") + 1
                    found.append((path, line, m.group(1), lines))
    return found


MEMBERS = [".", "kernels", "models", "data", "rlhf", "actors"]


def unused_dependencies(top):
    """`(package, section, name)` of each declared dependency nothing in its package names."""
    found, declared = [], set()
    for member in MEMBERS:
        base = os.path.join(top, member)
        manifest = tomllib.load(open(os.path.join(base, "Cargo.toml"), "rb"))
        meta = manifest.get("package", {}).get("metadata", {}).get("house-check", {})
        keep = set(meta.get("features-only", []))
        files = []
        for sub in ("src", "tests", "benches", "examples"):
            files += glob.glob(os.path.join(base, sub, "**", "*.rs"), recursive=True)
        if os.path.isfile(os.path.join(base, "build.rs")):
            files.append(os.path.join(base, "build.rs"))
        text = "\n".join(open(f, encoding="utf-8").read() for f in files)
        for section in ("dependencies", "dev-dependencies", "build-dependencies"):
            for name in manifest.get(section, {}):
                declared.add(name)
                ident = name.replace("-", "_")
                named = re.search(rf"\b{ident}\s*::|\buse\s+{ident}\b|\bextern crate\s+{ident}\b", text)
                if not named and name not in keep:
                    found.append((member, section, name))
    workspace = tomllib.load(open(os.path.join(top, "Cargo.toml"), "rb"))["workspace"]
    for name in workspace.get("dependencies", {}):
        if name not in declared:
            found.append((".", "workspace.dependencies", name))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-fn-lines", type=int, default=80)
    args = ap.parse_args()
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = 0
    for crate, src in CRATES.items():
        root = os.path.join(top, src)
        for comp in cycles(edges(root)):
            bad += 1
            print("import cycle: " + " -> ".join(os.path.relpath(p, top) for p in comp))
        for path, line, name, n in long_functions(root, args.max_fn_lines):
            bad += 1
            print(f"{os.path.relpath(path, top)}:{line}: fn {name} is {n} lines "
                  f"(over {args.max_fn_lines})")
    for member, section, name in unused_dependencies(top):
        bad += 1
        print(f"{os.path.join(member, 'Cargo.toml')}: [{section}] {name} is never used")
    print(f"house check: {bad} finding(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
