#!/usr/bin/env bash
# Build KenLM's estimation tools (lmplz, build_binary, query) from the PyPI `kenlm` source
# distribution, and install the Python `kenlm` module.  Idempotent: each step is skipped when
# its result is already there, so running it again costs a few seconds.
#
#   tools/build_kenlm.sh            # binaries go to ${NLMFEATURE_KENLM_BIN:-~/.cache/nlmfeature/kenlm/bin}
#
# nlmfeature.training.kenlm_baseline looks for lmplz in $NLMFEATURE_KENLM_BIN, then in that cache
# directory, then on $PATH.
#
# Needs: Debian/Ubuntu (apt-get; run as root or with sudo), network access to apt and PyPI.
# Environment: NLMFEATURE_KENLM_CACHE (default ~/.cache/nlmfeature/kenlm) holds the sdist and
# the build tree; NLMFEATURE_KENLM_BIN (default $CACHE/bin) receives the binaries;
# JOBS (default 2) is the make parallelism.
set -euo pipefail

CACHE="${NLMFEATURE_KENLM_CACHE:-$HOME/.cache/nlmfeature/kenlm}"
BIN="${NLMFEATURE_KENLM_BIN:-$CACHE/bin}"
JOBS="${JOBS:-2}"
PYTHON="${PYTHON:-python3}"

log() { echo "build_kenlm: $*" >&2; }

# 1. Debian build dependencies (only the missing ones are installed).
PKGS=(build-essential cmake libboost-program-options-dev libboost-system-dev libboost-thread-dev
      libboost-test-dev zlib1g-dev libbz2-dev liblzma-dev)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
else
    log "Debian packages present"
fi

# 2. lmplz and build_binary from the kenlm sdist (it contains lm/builder).
if [ -x "$BIN/lmplz" ] && [ -x "$BIN/build_binary" ] && [ -x "$BIN/query" ]; then
    log "binaries already built"
else
    mkdir -p "$CACHE/sdist"
    sdist=$(ls "$CACHE"/sdist/kenlm-*.tar.gz 2>/dev/null | head -n 1 || true)
    if [ -z "$sdist" ]; then
        log "downloading the kenlm source distribution"
        # only kenlm itself as source: "--no-binary :all:" would also build its build
        # dependencies (cmake!) from source just to read the metadata
        "$PYTHON" -m pip download --quiet --no-binary kenlm --no-deps --dest "$CACHE/sdist" kenlm
        sdist=$(ls "$CACHE"/sdist/kenlm-*.tar.gz | head -n 1)
    fi
    src="$CACHE/src"
    rm -rf "$src" "$CACHE/build"
    mkdir -p "$src" "$CACHE/build"
    tar -xzf "$sdist" -C "$src" --strip-components=1
    [ -d "$src/lm/builder" ] || { log "error: $sdist has no lm/builder: cannot build lmplz"; exit 1; }
    # Debian's cmake, not a pip-installed one on $PATH: cmake >= 4 refuses KenLM's old
    # cmake_minimum_required; the policy minimum keeps newer cmakes working too.
    CMAKE=/usr/bin/cmake
    [ -x "$CMAKE" ] || CMAKE=cmake
    log "configuring with $("$CMAKE" --version | head -n 1)"
    "$CMAKE" -S "$src" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
        -DCOMPILE_TESTS=OFF >"$CACHE/cmake.log" 2>&1 || { tail -n 30 "$CACHE/cmake.log" >&2; exit 1; }
    log "compiling lmplz, build_binary and query (make -j$JOBS; log in $CACHE/make.log)"
    make -C "$CACHE/build" -j"$JOBS" lmplz build_binary query >"$CACHE/make.log" 2>&1 \
        || { tail -n 30 "$CACHE/make.log" >&2; exit 1; }
    mkdir -p "$BIN"
    for tool in lmplz build_binary query; do
        path=$(find "$CACHE/build" -type f -name "$tool" -perm -u+x | head -n 1)
        [ -n "$path" ] || { log "error: $tool was not built"; exit 1; }
        install -m 0755 "$path" "$BIN/$tool.tmp.$$"
        mv -f "$BIN/$tool.tmp.$$" "$BIN/$tool"
    done
fi

# 3. The Python module (queries ARPA and binary models).
if "$PYTHON" -c "import kenlm" 2>/dev/null; then
    log "Python kenlm module present"
else
    log "installing the Python kenlm module"
    "$PYTHON" -m pip install --quiet kenlm
fi

"$BIN/lmplz" --help >/dev/null 2>&1 || true
log "lmplz, build_binary and query are in $BIN"
echo "$BIN"
