#!/usr/bin/env python3
"""Time the k-best readers on a real 100-best list, optionally side by side with another tree.

    python3 benchmarks/bench_kbest_read.py                       # this tree
    python3 benchmarks/bench_kbest_read.py --baseline /tmp/base  # paired: a checkout of another
                                                            # revision (built or with its .so)

Prints, per tree, the best of ``--repeat`` runs (trees alternate, so load on the machine
hits both alike) of: ``textio.iter_lines`` (decompress + decode), ``read_kbest`` (full
parse) and ``check_line`` (the check rescoring uses), over every line of the list; then
``rescore`` of the whole list with a small model (order 4, 16-wide; reading, checking,
scoring and writing .gz), and reading the two tuning test lists into a pool plus MERT with
10 restarts (the native loops and the BLEU of :mod:`nlmfeature.mt.bleu`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from nlmfeature.bench import shared_data

LIST = shared_data("nbest", "moses-multi30k-de-en", "dev.iter1.100best.gz")
CHILD = r'''
import sys, time, json
sys.path.insert(0, sys.argv[1])
from nlmfeature.mt.kbest import read_kbest, check_line
try:
    from nlmfeature.io.textio import iter_lines
except ImportError:
    from nlmfeature.mt.kbest import iter_lines
KB = sys.argv[2]
t = time.perf_counter(); n = sum(1 for _ in iter_lines(KB)); a = time.perf_counter() - t
t = time.perf_counter(); f = sum(len(h.features) for h in read_kbest(KB)); b = time.perf_counter() - t
t = time.perf_counter(); s = sum(check_line(l, "moses", KB, i)[0] for i, l in iter_lines(KB))
c = time.perf_counter() - t
from nlmfeature.mt.rescore import rescore
t = time.perf_counter()
st = rescore(KB, sys.argv[3] + "/out.gz", [sys.argv[3] + "/bench.nlm"], progress=False,
             log=lambda m: None)
d = time.perf_counter() - t
from nlmfeature.mt.bleu import References
from nlmfeature.mt.tuning.data import KbestPool
from nlmfeature.mt.tuning.mert import MertOptions, optimise
from nlmfeature.mt.weights import read_weights
T = sys.argv[4] + "/tests/data/tuning/"
t = time.perf_counter()
pool = KbestPool(References.from_files([T + "multi30k.dev.ref.200.en"]))
pool.add_file(T + "multi30k.dev.iter1.200x30.kbest.gz")
pool.add_file(T + "multi30k.dev.iter2.200x30.kbest.gz")
w0 = pool.weight_vector(read_weights(T + "multi30k.dev.iter1.moses.ini"))
r = optimise(pool.arrays(), [w0], MertOptions(restarts=10, seed=0))
e = time.perf_counter() - t
print(json.dumps([a, b, c, d, e, n, f, s, st.hypotheses, round(float(r.bleu), 4)]))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", default=LIST, help=f"k-best list to read (default {LIST})")
    ap.add_argument("--baseline", metavar="TREE", help="another source tree to time alongside")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tree (best is shown)")
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = [here] + ([os.path.abspath(args.baseline)] if args.baseline else [])
    runs = {t: [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="bench-kbest-") as tmp:
        sys.path[:0] = [here, os.path.join(here, "tests")]
        from helpers import make_model     # a small random model with the Brown vocabulary
        make_model(tmp, "bench.nlm", order=4, word_width=16)
        for _ in range(args.repeat):
            for tree in trees:
                out = subprocess.run([sys.executable, "-c", CHILD, tree, args.list, tmp, here],
                                     cwd="/", capture_output=True, text=True, check=True)
                runs[tree].append(json.loads(out.stdout))
    for tree, rs in runs.items():
        best = [min(r[i] for r in rs) for i in range(5)]
        print(f"{tree}: {rs[0][5]} lines  iter_lines {best[0]:.3f} s  read_kbest {best[1]:.3f} s  "
              f"check_line {best[2]:.3f} s  rescore {best[3]:.2f} s  pool+MERT {best[4]:.2f} s  "
              f"(checks {rs[0][6]} {rs[0][7]} {rs[0][8]}, MERT BLEU {rs[0][9]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
