#!/usr/bin/env python3
"""No circles between files (ARCHITECTURE.md, "Invariants"): within a crate, the source files'
uses of each other's items form no cycle, so each file can be read knowing only those below it.

An edge goes from a file to the file that defines an item it names: in a `use` (braces
expanded), or inline as `crate::…`, `super::…`, `self::…`, or, in a `lib.rs` / `mod.rs`, a
child module's name. A `pub use` is a re-export, not a use: names reached through it are
followed to the file that defines them. A child using its parent (or any ancestor) module is
no edge: Rust's privacy gives a child its parent's items, and the parent, which declares the
child, is its facade. `#[cfg(test)] mod …` blocks are left out.

Usage: circles.py [ROOT]  (ROOT holds `crates/`; default the current directory.) Exits 1 naming
each circle and, per file in it, the names that make its edges; circles wholly under a path in
KNOWN are printed as known and do not fail the check.
"""
import os
import re
import sys

# Circles that other work removes, with why they stay for now. A path matches a file under it.
KNOWN = {}

USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.S)
INLINE = re.compile(r"(?<![:\w])((?:crate|super|self)(?:::\w+)+)")
TESTS = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")


def modules(src):
    """Module path (a tuple) -> file, for every `.rs` file under `src`."""
    out = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            parts = os.path.relpath(path, src)[:-3].split(os.sep)
            if parts[-1] in ("lib", "main", "mod"):
                parts = parts[:-1]
            out[tuple(parts)] = path
    return out


def expand(tree):
    """`a::{b, c::{d, e}}` -> [`a::b`, `a::c::d`, `a::c::e`]."""
    i = tree.find("{")
    if i < 0:
        return [tree]
    prefix, body = tree[:i], tree[i + 1 : tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [prefix + q for p in parts if p.strip() for q in expand(p)]


def source(path):
    text = re.sub(r"//[^\n]*", "", open(path, encoding="utf-8").read())
    m = TESTS.search(text)
    return text[: m.start()] if m else text


def resolve(mods, here, is_dir, path):
    """The module a path names and the item it names in it (or None for outside the crate)."""
    segs = [s.split(" as ")[0] for s in path.split("::") if s]
    if len(segs) > 1 and segs[-1] == "self":  # `use a::b::{self}` names module b
        segs = segs[:-1]
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] == "super":
        # In `a/b.rs` (module a::b), `super` is `a`; in `a/b/mod.rs` too.
        base, segs = list(here[:-1]), segs[1:]
        while segs and segs[0] == "super":
            base, segs = base[:-1], segs[1:]
    elif segs[0] == "self":
        base, segs = list(here), segs[1:]
    elif is_dir and here + (segs[0],) in mods:
        base = list(here)
    else:
        return None
    full = base + segs
    for k in range(len(full), -1, -1):
        if tuple(full[:k]) in mods:
            return tuple(full[:k]), (full[k] if k < len(full) else "")
    return None


def graph(src):
    mods = modules(src)
    reexports, uses = {}, {}
    for mod, path in mods.items():
        text = source(path)
        is_dir = os.path.basename(path) in ("lib.rs", "main.rs", "mod.rs")
        found = []
        for vis, tree in USE.findall(text):
            found += [(bool(vis), p) for p in expand(re.sub(r"\s+", "", tree))]
        found += [(False, p) for p in INLINE.findall(text)]
        if is_dir:
            for kid in (m[-1] for m in mods if len(m) == len(mod) + 1 and m[:-1] == mod):
                found += [(False, p) for p in re.findall(rf"(?<![:\w])({kid}(?:::\w+)+)", text)]
        uses[mod] = []
        for is_pub, p in found:
            r = resolve(mods, mod, is_dir, p)
            if r is None or r[0] == mod:
                continue
            if is_pub:
                name = p.split("::")[-1].split(" as ")[-1]
                reexports[(mod, name)] = r
            else:
                uses[mod].append(r)
    edges = {}
    for mod, lst in uses.items():
        out = edges.setdefault(mod, {})
        for target in lst:
            for _ in range(10):  # a chain of re-exports, bounded
                if target not in reexports:
                    break
                target = reexports[target]
            to, item = target
            if to != mod and to != mod[: len(to)]:  # not itself, not an ancestor
                out.setdefault(to, set()).add(item or "*")
    return mods, edges


def circles(edges):
    """Strongly connected components with more than one file (Tarjan, iterative)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges.get(root, {})))]
        index[root] = low[root] = n
        n += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n
                    n += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(edges.get(w, {}))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


def main() -> int:
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    failed = known = 0
    crates = os.path.join(root, "crates")
    for crate in sorted(os.listdir(crates)):
        src = os.path.join(crates, crate, "src")
        if not os.path.isdir(src):
            continue
        mods, edges = graph(src)
        for comp in circles(edges):
            files = [os.path.relpath(mods[m], root) for m in comp]
            why = next((w for p, w in KNOWN.items() if all(f.startswith(p) for f in files)), None)
            print(f"{'known circle' if why else 'circle'} in {crate}: {', '.join(files)}")
            if why:
                print(f"  ({why})")
            for m in comp:
                names = [
                    f"{os.path.relpath(mods[t], root)} ({', '.join(sorted(edges[m][t]))})"
                    for t in sorted(edges[m])
                    if t in comp
                ]
                print(f"  {os.path.relpath(mods[m], root)} uses {'; '.join(names)}")
            known += why is not None
            failed += why is None
    if not failed:
        print(f"ok: no circles between files ({known} known)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
