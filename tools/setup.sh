#!/usr/bin/env bash
# All set-up on a fresh machine (Debian 12, Python 3.11, root): installs the package with its
# test and plot dependencies (building the Cython extensions and the C library), then KenLM's lmplz /
# build_binary for the baseline.  Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check -e '.[test,kenlm,plot]'
if [ -f tools/build_kenlm.sh ]; then
    bash tools/build_kenlm.sh
fi
