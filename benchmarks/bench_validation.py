#!/usr/bin/env python3
"""Cost of validating a model at load against the checksum's own cost, on 46k-word models
(the full Brown training vocabulary, ../shared/data/mono/brown or --corpus).

    python3 benchmarks/bench_validation.py [--workdir DIR] [--repeat 3]

For each model it prints the file size and the best of ``--repeat`` timings (warm page
cache, one thread) of: the checksum (BLAKE2b over the mapped file, as ``read_model(verify=
True)`` does), the whole validation (``modelfile.validate_structure``) and its parts
(vocabulary + rebuilt lookup table, class partition or tree, precomputed-table projection),
and the whole ``nlmfeature.load``.  The models are random (the weights do not change the
cost) and cached in the work directory.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import sys
import time
from collections import Counter

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import nlmfeature  # noqa: E402
from nlmfeature.core import modelfile  # noqa: E402
from nlmfeature.bench import shared_data  # noqa: E402
from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model  # noqa: E402
from nlmfeature.core.vocab import Vocabulary  # noqa: E402

MODELS = {
    "nplm-class-tables": dict(arch="nplm", order=5, word_width=150, hidden=256, output="class", classes=215),
    "lbl-tree": dict(arch="lbl", order=5, word_width=200, diagonal_contexts=True, output="tree"),
}


def build(path: str, corpus: str, fields: dict) -> None:
    counts: Counter = Counter()
    with gzip.open(corpus, "rt", encoding="utf-8") as f:
        for line in f:
            counts.update(line.split())
    vocab = Vocabulary.from_counts(counts)
    header, arrays = random_model(ModelSpec(**fields), vocab, np.array([counts.get(w, 1) for w in vocab], float))
    if fields["arch"] == "nplm":
        precompute_tables(header, arrays)
    nlmfeature.save(path, header, arrays)


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/tmp/nlmfeature-bench-validation", help="where the models are kept")
    ap.add_argument("--corpus", default=shared_data("mono", "brown", "train.txt.gz"),
                    help="text whose whole vocabulary the models get (default: Brown train, 46k words)")
    ap.add_argument("--repeat", type=int, default=3, help="timings per figure (the best is printed)")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"{'model':20s} {'V':>6s} {'MB':>6s} {'checksum':>9s} {'validate':>9s} {'(vocab':>7s} "
          f"{'out':>6s} {'tables)':>7s} {'load':>7s}  validate/checksum")
    for name, fields in MODELS.items():
        path = os.path.join(args.workdir, name + ".nlm")
        if not os.path.exists(path):
            build(path, args.corpus, fields)
        header, arrays, _ = modelfile.read_model(path, verify=False)
        V = header["vocab_size"]

        def checksum():
            import mmap
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            d = hashlib.blake2b(digest_size=8)
            view = memoryview(mm)
            for s in range(modelfile.PREAMBLE_SIZE, len(mm), 1 << 24):
                d.update(view[s:s + (1 << 24)])
            view.release()
            mm.close()

        t_sum = best(checksum, args.repeat)
        t_val = best(lambda: modelfile.validate_structure(header, arrays, strict=False), args.repeat)
        t_voc = best(lambda: modelfile._check_vocabulary(V, arrays), args.repeat)
        out = header["output"]
        if out["type"] == "class":
            t_out = best(lambda: modelfile._check_classes(V, out["classes"], arrays), args.repeat)
        elif out["type"] == "tree":
            t_out = best(lambda: modelfile._check_tree(V, out["nodes"], arrays), args.repeat)
        else:
            t_out = 0.0
        t_tab = best(lambda: modelfile._check_tables(header, arrays), args.repeat)
        t_load = best(lambda: nlmfeature.load(path), args.repeat)
        mb = os.path.getsize(path) / 1e6
        print(f"{name:20s} {V:6d} {mb:6.0f} {t_sum * 1e3:7.0f}ms {t_val * 1e3:7.0f}ms {t_voc * 1e3:5.0f}ms "
              f"{t_out * 1e3:4.0f}ms {t_tab * 1e3:5.0f}ms {t_load * 1e3:5.0f}ms  {t_val / t_sum:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
