"""Whether the installed nlmfeature is this checkout, built from its current sources.

``tools/setup.sh`` asks this before installing: a second run of the set-up then only checks
(a few seconds) instead of rebuilding every extension (about 90 s).

    python3 tools/install_stamp.py            # exit 0: current; 1: install needed (says why)
    python3 tools/install_stamp.py --record   # after a successful install: remember the sources

The stamp is a SHA-256 of everything the build reads (``setup.py``, ``pyproject.toml``, the
Cython sources, the C API sources) and of the Python interpreter, kept in
``build/install-stamp`` (ignored by git).  The install is an editable one, so Python
sources need no rebuild; a change to any built file or to the interpreter does.
"""
from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
from typing import List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAMP = os.path.join("build", "install-stamp")
#: what the build reads, relative to the checkout (generated C files excluded)
BUILD_INPUTS = ["setup.py", "pyproject.toml", "cython/**/*.pyx", "cython/**/*.pxd",
                "cython/**/*.pxi", "cython/**/*.h", "src/nlmfeature/decoder/capi/*.c", "src/nlmfeature/decoder/capi/*.h",
                "src/nlmfeature/decoder/capi/*.py"]
#: modules the tests need besides the package
TEST_MODULES = ["pytest", "numpy", "sacrebleu", "sacremoses", "tqdm", "kenlm", "torch"]


def build_inputs(root: str = ROOT) -> List[str]:
    """The files the build reads, sorted, relative to ``root``."""
    files = set()
    for pattern in BUILD_INPUTS:
        files.update(os.path.relpath(p, root)
                     for p in glob.glob(os.path.join(root, pattern), recursive=True))
    return sorted(files)


def stamp(root: str = ROOT) -> str:
    """SHA-256 of the build inputs' names and contents and of the interpreter."""
    h = hashlib.sha256(f"{sys.executable}\0{sys.version}\0".encode())
    for rel in build_inputs(root):
        h.update(rel.encode() + b"\0")
        with open(os.path.join(root, rel), "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def why_not_current(root: str = ROOT) -> Optional[str]:
    """None if the installed package is this checkout built from its current sources, else
    the reason to install."""
    path = os.path.join(root, STAMP)
    if not os.path.exists(path):
        return "no record of an install from this checkout"
    with open(path, encoding="utf-8") as f:
        if f.read().strip() != stamp(root):
            return "the build sources or the interpreter changed since the last install"
    probe = ("import os, nlmfeature, nlmfeature._scorer, nlmfeature._train, nlmfeature._capi; "
             "from nlmfeature.commands.config import paths; "
             "assert os.path.exists(paths()['library']), 'libnlmfeature.so missing'; "
             # the test and optional modules are found, not imported (torch takes seconds)
             "import importlib.util; "
             f"missing = [m for m in {TEST_MODULES!r} if importlib.util.find_spec(m) is None]; "
             "assert not missing, 'not installed: ' + ', '.join(missing); "
             "print(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(nlmfeature.__file__)))))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       cwd=os.path.dirname(root) or "/")   # not the checkout: the installed one
    if r.returncode != 0:
        return "the installed package does not import: " + (r.stderr.strip().splitlines() or ["?"])[-1]
    if os.path.realpath(r.stdout.strip()) != os.path.realpath(root):   # root/src/nlmfeature
        return f"the installed nlmfeature is {r.stdout.strip()}, not this checkout"
    return None


def record(root: str = ROOT) -> None:
    """Remember that the current sources are installed."""
    os.makedirs(os.path.join(root, "build"), exist_ok=True)
    with open(os.path.join(root, STAMP), "w", encoding="utf-8") as f:
        f.write(stamp(root) + "\n")


def main(argv: List[str]) -> int:
    if argv[1:] == ["--record"]:
        record()
        return 0
    reason = why_not_current()
    if reason:
        print(f"setup: installing ({reason})", file=sys.stderr)
        return 1
    print("setup: nlmfeature is installed from this checkout and built from its current "
          "sources: nothing to rebuild", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
