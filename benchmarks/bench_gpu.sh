#!/usr/bin/env bash
# The torch engine's training speed on a machine with a GPU: `nlmfeature bench scale --parts
# corpus,speed --engines torch` (every torch speed recipe, and on a GPU the 500-wide
# shared-noise recipe of nlmfeature.bench.scale.GPU_RECIPES), on a machine that has Python with
# PyTorch, numpy, Cython and a C compiler but possibly no network: the package is built in place
# (no pip), the text compiled and timed.
#
#   bash benchmarks/bench_gpu.sh TEXT VALID OUTDIR [more `bench scale` flags]
#
# TEXT: tokenised training text (plain, .gz or .xz), e.g. the 10M-token sample that
# `bench scale --sizes 10M` writes (WORKDIR/train.10000000.spread.txt; xz makes it 13 MB);
# VALID: held-out text (e.g. the corpus's valid.txt).  OUTDIR gets device.txt (torch, GPU),
# build.log, bench-scale.json, bench-scale.md and bench-scale.log.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 3 ]; then
    sed -n '2,13p' "$0" >&2
    exit 2
fi
text=$1 valid=$2 out=$3
shift 3
mkdir -p "$out"
start=$SECONDS
if ! python3 setup.py build_ext --inplace -j "$(nproc)" > "$out/build.log" 2>&1; then
    tail -40 "$out/build.log" >&2
    echo "bench_gpu: building the package failed (above; $out/build.log)" >&2
    exit 1
fi
echo "bench_gpu: built in $((SECONDS - start)) s" >&2
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c 'import torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, {gpu}, {torch.cuda.device_count()} device(s)")' | tee "$out/device.txt"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m nlmfeature.cli bench scale --train "$text" --valid "$valid" --test "$valid" --workdir "$work" \
    --sizes all --repeat '' --threads 1 --engines torch --parts corpus,speed --max-vocab 100000 "$@" \
    --results "$out/bench-scale.md" --json > "$out/bench-scale.json" 2> >(tee "$out/bench-scale.log" >&2)
cat "$out/bench-scale.md"
