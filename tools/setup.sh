#!/usr/bin/env bash
# All set-up on a fresh machine (Debian 12, Python 3.11, root): installs the package with its
# test and plot dependencies (building the Cython extensions and the C library), then KenLM's
# lmplz / build_binary for the baseline.  A second run only checks (a few seconds): the install
# is skipped when the installed package is this checkout built from its current sources
# (tools/install_stamp.py), and tools/build_kenlm.sh skips what it has built.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 tools/install_stamp.py; then
    python3 -m pip install -q --disable-pip-version-check -e '.[test,kenlm,plot,torch]'
    python3 tools/install_stamp.py --record
fi
if [ -f tools/build_kenlm.sh ]; then
    bash tools/build_kenlm.sh
fi
