#!/usr/bin/env bash
# All set-up on a fresh machine (Debian 12, Python 3.11, root): installs the package with its
# test and plot dependencies (building its Cython extensions, in parallel, and the C library),
# then the optional PyTorch training engine, then KenLM's lmplz / build_binary for the
# baseline; each part prints its time on a line of its own.  A second run only checks (a few
# seconds): the install is skipped when the installed package is this checkout built from its
# current sources (tools/install_stamp.py), and tools/build_kenlm.sh skips what it has built.
set -euo pipefail
cd "$(dirname "$0")/.."
pip=(python3 -m pip install -q --disable-pip-version-check)
if ! python3 tools/install_stamp.py; then
    start=$SECONDS
    # the build's requirements (pyproject.toml) first: pip then builds here, without an
    # isolated build environment of its own (a second numpy, Cython and setuptools to install)
    "${pip[@]}" $(python3 -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
    "${pip[@]}" --no-build-isolation -e '.[test,kenlm,plot]'
    echo "set-up: the package and its test dependencies in $((SECONDS - start)) s" >&2
    start=$SECONDS
    # the optional torch engine (train --engine torch): the version the torch extra pins
    torch=$(python3 -c 'from importlib.metadata import requires
pins = [r.split(";")[0].strip() for r in requires("nlmfeature") if "extra == \"torch\"" in r]
print(pins[0] if pins else "")')
    [ -n "$torch" ] || { echo "set-up: setup.py declares no torch extra" >&2; exit 1; }
    "${pip[@]}" "$torch"
    echo "set-up: the optional PyTorch engine in $((SECONDS - start)) s" >&2
    python3 tools/install_stamp.py --record
fi
if [ -f tools/build_kenlm.sh ]; then
    start=$SECONDS
    bash tools/build_kenlm.sh
    echo "set-up: KenLM in $((SECONDS - start)) s" >&2
fi
