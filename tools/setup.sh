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
    "${pip[@]}" $(python3 tools/requirements.py build)
    # the package builds (its extensions on every core) while pip installs its dependencies
    # beside it: the compiler leaves a core idle for a good part of its run
    mkdir -p build
    "${pip[@]}" --no-build-isolation --no-deps -e . > build/setup-install.log 2>&1 &
    build=$!
    deps_ok=0
    "${pip[@]}" $(python3 tools/requirements.py test kenlm plot) || deps_ok=$?
    if ! wait $build; then
        cat build/setup-install.log >&2
        echo "set-up: building the package failed (above)" >&2
        exit 1
    fi
    [ "$deps_ok" = 0 ] || { echo "set-up: installing the dependencies failed (above)" >&2; exit 1; }
    echo "set-up: the package and its test dependencies in $((SECONDS - start)) s" >&2
    start=$SECONDS
    # the optional torch engine (train --engine torch): the version the torch extra pins
    "${pip[@]}" $(python3 tools/requirements.py torch)
    echo "set-up: the optional PyTorch engine in $((SECONDS - start)) s" >&2
    python3 tools/install_stamp.py --record
fi
if [ -f tools/build_kenlm.sh ]; then
    start=$SECONDS
    bash tools/build_kenlm.sh
    echo "set-up: KenLM in $((SECONDS - start)) s" >&2
fi
