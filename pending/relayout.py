#!/usr/bin/env python3
"""One-off: move nlmfeature/ to src/nlmfeature/ with subpackages; rewrite imports.

Usage: relayout.py REPO
Step 1 turns every relative import inside the package into an absolute one, step 2 moves the
files (git mv), step 3 rewrites absolute module paths everywhere (src, tests, tools, docs, setup).
"""
import os
import re
import subprocess
import sys

REPO = os.path.abspath(sys.argv[1])
PKG = os.path.join(REPO, "nlmfeature")

# old module (relative to nlmfeature) -> new module
MOVES = {
    "vocab": "core.vocab",
    "modelfile": "core.modelfile",
    "model": "core.model",
    "architecture": "core.architecture",
    "outputs": "core.outputs",
    "batch": "core.batch",
    "textio": "io.textio",
    "atomicfile": "io.atomicfile",
    "querylog": "decoder.querylog",
    "pcache": "decoder.pcache",
    "capi": "decoder.capi",
    "kbest": "mt.kbest",
    "rescore": "mt.rescore",
    "bleu": "mt.bleu",
    "evaluate": "mt.evaluate",
    "weights": "mt.weights",
    "tuning": "mt.tuning",
    "clusters": "training.clusters",
    "kenlm_baseline": "training.kenlm_baseline",
    "nplm": "training.nplm",
    "bench_query": "bench.query",
    "bench_train": "bench.train",
    "demo": "commands.demo",
    "forward": "core.forward",
    "progress": "io.progress",
    "prepare": "mt.prepare",
    "bench_mt": "bench.mt",
    "bench_memory": "bench.memory",
}
for extra in sys.argv[2:]:  # more OLD=NEW pairs for modules added since
    old, new = extra.split("=")
    MOVES[old] = new
NEW_PACKAGES = {"core": "Model files, vocabularies, models and the native scorer's Python wrappers.",
                "io": "The one text reader and the one atomic writer.",
                "decoder": "What decoders load: the C API build, query logs, the persistent cache.",
                "mt": "Machine translation: k-best lists, rescoring, BLEU, tuning, evaluation.",
                "bench": "Benchmarks that print figures (`nlmfeature bench ...`)."}


def git(*args):
    subprocess.run(["git", "-C", REPO, *args], check=True)


def package_of(path):
    rel = os.path.relpath(path, REPO)
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts)
    return ".".join(parts[:-1])


REL = re.compile(r"^(\s*)from (\.+)([\w.]*) import ", re.M)


def absolutise(path):
    src = open(path, encoding="utf-8").read()
    pkg = package_of(path).split(".")

    def sub(m):
        dots, rest = len(m.group(2)), m.group(3)
        base = pkg[: len(pkg) - (dots - 1)]
        mod = ".".join(base + ([rest] if rest else []))
        return f"{m.group(1)}from {mod} import "

    new = REL.sub(sub, src)
    if new != src:
        open(path, "w", encoding="utf-8").write(new)


def py_files(root):
    for d, _, files in os.walk(root):
        if "/build" in d or "__pycache__" in d:
            continue
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(d, f)


# 1. absolute imports inside the package
for p in py_files(PKG):
    absolutise(p)

# `from nlmfeature import mod` / `from nlmfeature.pkg import mod` for moved modules
FROM_IMPORT = re.compile(r"^(\s*)from nlmfeature import ([\w, ]+)$", re.M)


def split_from_imports(text):
    def sub(m):
        names = [n.strip() for n in m.group(2).split(",")]
        moved = [n for n in names if n in MOVES]
        kept = [n for n in names if n not in MOVES]
        lines = []
        if kept:
            lines.append(f"{m.group(1)}from nlmfeature import {', '.join(kept)}")
        for n in moved:
            parent, _, leaf = ("nlmfeature." + MOVES[n]).rpartition(".")
            lines.append(f"{m.group(1)}from {parent} import {leaf}" + (f" as {n}" if leaf != n else ""))
        return "\n".join(lines)
    return FROM_IMPORT.sub(sub, text)


DOTTED = re.compile(r"\bnlmfeature\.(\w+)\b")
SLASHED = re.compile(r"\bnlmfeature/(\w+)(\.py|/)")


def rewrite(text, slashes):
    text = split_from_imports(text)
    text = DOTTED.sub(lambda m: "nlmfeature." + MOVES.get(m.group(1), m.group(1)), text)
    if slashes:
        text = SLASHED.sub(lambda m: "nlmfeature/" + MOVES.get(m.group(1), m.group(1)).replace(".", "/") + m.group(2)
                           if m.group(1) in MOVES else m.group(0), text)
    return text


# 2. move files
git("mv", "nlmfeature", "src/nlmfeature") if os.path.isdir(os.path.join(REPO, "src")) else (
    os.makedirs(os.path.join(REPO, "src")), git("mv", "nlmfeature", "src/nlmfeature"))
SRC = os.path.join(REPO, "src", "nlmfeature")
for sub, doc in NEW_PACKAGES.items():
    d = os.path.join(SRC, sub)
    os.makedirs(d, exist_ok=True)
    init = os.path.join(d, "__init__.py")
    if not os.path.exists(init):
        open(init, "w").write(f'"""{doc}"""\n')
        git("add", init)
for old, new in MOVES.items():
    parts = new.split(".")
    src_dir = os.path.join(SRC, old)
    src_py = src_dir + ".py"
    dst = os.path.join(SRC, *parts)
    if os.path.isdir(src_dir):
        git("mv", src_dir, dst)
    elif os.path.exists(src_py):
        git("mv", src_py, dst + ".py")
    else:
        print("missing", old)

# 3. rewrite module paths everywhere
targets = []
for root in ("src", "tests", "tools", "docs", "moses_ff", "cdec_ff", "cython"):
    for d, _, files in os.walk(os.path.join(REPO, root)):
        if "__pycache__" in d:
            continue
        for f in files:
            if f.endswith((".py", ".md", ".sh", ".pyx", ".pxd", ".txt", ".cpp", ".cc", ".h")) or (f.endswith(".c") and "/cython/" not in d + "/") or f == "Makefile":
                targets.append(os.path.join(d, f))
targets += [os.path.join(REPO, f) for f in ("setup.py", "README.md", ".ci/run", ".gitignore")]
for p in targets:
    if not os.path.exists(p) or os.path.islink(p):
        continue
    try:
        text = open(p, encoding="utf-8").read()
    except UnicodeDecodeError:
        continue
    new = rewrite(text, slashes=True).replace('"../../nlmfeature/', '"../../src/nlmfeature/')
    if new != text:
        open(p, "w", encoding="utf-8").write(new)
print("moved", len(MOVES), "modules")

# hand fixes the rewrite cannot know
def edit(path, old, new):
    path = os.path.join(REPO, path)
    s = open(path, encoding="utf-8").read()
    if old not in s:
        print("edit: not found in", path, ":", old[:60])
    open(path, "w", encoding="utf-8").write(s.replace(old, new))

edit("setup.py", 'os.path.join(HERE, "nlmfeature", "capi", "build.py")', 'os.path.join(HERE, "src", "nlmfeature", "decoder", "capi", "build.py")')
edit("setup.py", '(see nlmfeature/decoder/capi/build.py)', '(see src/nlmfeature/decoder/capi/build.py)')
edit("setup.py", 'packages=find_packages(include=["nlmfeature", "nlmfeature.*"]),', 'package_dir={"": "src"},\n    packages=find_packages(where="src", include=["nlmfeature", "nlmfeature.*"]),')
edit("setup.py", '"capi/*.c", "capi/*.h", "capi/*.py"', '"decoder/capi/*.c", "decoder/capi/*.h", "decoder/capi/*.py"')
edit("src/nlmfeature/decoder/capi/build.py", 'package_dir = os.path.dirname(CAPI_DIR)', 'package_dir = os.path.dirname(os.path.dirname(CAPI_DIR))')
edit(".gitignore", '!nlmfeature/decoder/capi/*.c', '!src/nlmfeature/decoder/capi/*.c')
edit(".gitignore", '/nlmfeature/include/', '/src/nlmfeature/include/')
edit(".gitignore", '/nlmfeature/lib/', '/src/nlmfeature/lib/')
