#!/usr/bin/env python3
"""Which NLM features to rescore with: k-best rescoring of ``nlmfeature bench mt``'s 1000-best
lists (the KenLM-only Moses system's, with word alignments) under many feature sets, each
tuned on dev by MERT with several seeds (docs/joint.md, "Rescoring 1000-best lists").

Every model scores the dev and test lists once (``nlmfeature-rescore``, one column each,
named by ``--model NAME=PATH``; joint models get the set's source and each hypothesis' Moses
word alignment); then, for every ``--set`` (names joined by ``+``), MERT (``nlmfeature-tune
optimise``'s optimiser, ``--restarts`` random restarts, seeds 1..``--seeds``) tunes the
KenLM-only features plus that set on dev, from the system's weights (new features at half the
LM weight), and dev and test are reranked.  Reported: mean ± sd of BLEU over the seeds on dev
and test, and the paired-bootstrap p-value of the difference of the means against the
KenLM-only features tuned the same way.  Choose on dev; test is only reported.

Example (the figures in docs/joint.md)::

    python3 tools/rescore_sets.py --rescoring W/rescoring.KEY --dev-ref W/dev.ref.en \\
        --test-ref W/test.ref.en --dev-src W/dev.src.de --test-src W/test.src.de \\
        --model LBL5=lbl5.nlm --model R2L8=r2l8.nlm --model JSN=joint-sn.nlm \\
        --set LBL5 --set LBL5+R2L8 --set LBL5+R2L8+JSN --seeds 3 --json out.json

It prints a text table and the markdown table of docs/joint.md; ``rescore_sets.py --markdown
out.json`` reprints the latter from a saved ``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def log(msg: str) -> None:
    print(f"[rescore_sets {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def markdown(results: dict) -> str:
    """The results as the markdown table of docs/joint.md."""
    rows = ["| features | dev BLEU | diff (p) | test2016 BLEU | diff (p) |",
            "|---|---|---|---|---|"]
    for key, e in results.items():
        cells = []
        for p in ("dev", "test"):
            s = e[p]
            cells.append(f"{s['mean']:.2f} ± {s['sd']:.2f} ({s['min']:.2f}-{s['max']:.2f})")
            cells.append(f"{s['difference']:+.2f} ({s['p_value']:.3f})" if "p_value" in s else "")
        rows.append(f"| {key.replace('+', ' + ')} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    if sys.argv[1:2] == ["--markdown"]:      # reprint a saved --json as markdown
        print(markdown(json.load(open(sys.argv[2], encoding="utf-8"))["results"]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rescoring", required=True,
                    help="bench mt's rescoring.KEY folder (dev/test.KBESTbest.wa lists, "
                         "kbest.moses.ini)")
    ap.add_argument("--kbest", type=int, default=1000, help="k-best size of the lists (1000)")
    ap.add_argument("--dev-ref", required=True)
    ap.add_argument("--test-ref", required=True)
    ap.add_argument("--dev-src", required=True, help="tokenised dev source (joint models)")
    ap.add_argument("--test-src", required=True, help="tokenised test source (joint models)")
    ap.add_argument("--model", action="append", required=True, metavar="NAME=PATH",
                    help="a feature: its column name (no '_') and model file; repeatable")
    ap.add_argument("--set", action="append", required=True, metavar="A+B",
                    help="a feature set to tune (names joined by '+'); repeatable")
    ap.add_argument("--seeds", type=int, default=3, help="MERT seeds 1..N per set (3)")
    ap.add_argument("--algorithm", choices=("mert", "mira", "pro"), default="mert",
                    help="optimiser (nlmfeature-tune optimise's; default mert)")
    ap.add_argument("--restarts", type=int, default=20, help="MERT random restarts (20)")
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (1000)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    from nlmfeature.bench.mt import KbestMatrix, Scorer, mean_pair_bootstrap, score, summarise
    from nlmfeature.mt import rescore
    from nlmfeature.mt.bleu import References
    from nlmfeature.mt.tuning import optimise_pool
    from nlmfeature.mt.tuning.data import KbestPool, PoolArrays
    from nlmfeature.mt.weights import read_weights

    models = dict(m.split("=", 1) for m in args.model)
    sets = [s.split("+") for s in args.set]
    for s in sets:
        for n in s:
            if n not in models:
                sys.exit(f"--set names {n!r}, which no --model defines")
    names = list(models)
    tag = "feats." + ".".join(names)
    lists = {}
    for part, src in (("dev", args.dev_src), ("test", args.test_src)):
        kb = os.path.join(args.rescoring, f"{part}.{args.kbest}best.wa")
        out = kb + "." + tag + ".gz"
        if not os.path.exists(out):
            argv = ["-i", kb, "-o", out, "-q", "--source", src]
            for n in names:
                argv += ["-m", models[n], "--name", n]
            t0 = time.time()
            if rescore.main(argv):
                sys.exit("nlmfeature-rescore failed")
            log(f"scored {part} with {len(names)} models in {time.time() - t0:.0f} s")
        lists[part] = out
    base_w = read_weights(os.path.join(args.rescoring, "kbest.moses.ini"))
    half = base_w["LM0"][0] / 2
    t0 = time.time()
    pool = KbestPool(References.from_files([args.dev_ref]))   # as bench mt's tunings
    pool.add_files([lists["dev"]])
    arrays = pool.arrays()
    log(f"dev pool: {pool.num_hypotheses} distinct hypotheses, {pool.dim} columns "
        f"({time.time() - t0:.0f} s)")
    col_of = {}
    col = 0
    for label, k in pool.labels:
        col_of[label] = list(range(col, col + k))
        col += k
    base_labels = [l for l, _ in pool.labels if l not in models]
    matrices = {p: KbestMatrix(lists[p]) for p in ("dev", "test")}
    scorers = {"dev": Scorer(args.dev_ref, args.dev_ref, "en"),
               "test": Scorer(args.test_ref, args.test_ref, "en")}
    results = {}
    all_sets = [[]] + [s for s in sets if s]
    for feats in all_sets:
        key = "+".join(feats) or "KenLM"
        labels = base_labels + feats
        cols = [c for l in labels for c in col_of[l]]
        sub = PoolArrays(np.ascontiguousarray(arrays.features[:, cols]), arrays.stats,
                         arrays.offsets)
        init = np.concatenate([np.asarray(base_w[l] if l in base_w else [half], dtype=np.float64)
                               for l in labels])
        runs = []
        for seed in range(1, args.seeds + 1):
            t1 = time.time()
            res = optimise_pool(sub, args.algorithm, init, settings=dict(seed=seed, restarts=args.restarts,
                                                                   jobs=1))
            w = {}
            i = 0
            for l in labels:
                k = len(col_of[l])
                w[l] = [float(x) for x in res.weights[i:i + k]]
                i += k
            stats = {p: scorers[p].stats_lines(matrices[p].one_best(w)) for p in ("dev", "test")}
            runs.append(dict(weights=w, stats=stats))
            log(f"{key} seed {seed}: pool BLEU {res.bleu:.2f}, dev "
                f"{score(scorers['dev'], 'bleu', stats['dev']['bleu']):.2f}, test "
                f"{score(scorers['test'], 'bleu', stats['test']['bleu']):.2f} "
                f"({time.time() - t1:.0f} s)")
        results[key] = runs
    out = {}
    base = results["KenLM"]
    for key, runs in results.items():
        entry = {}
        for p in ("dev", "test"):
            s = summarise([score(scorers[p], "bleu", r["stats"][p]["bleu"]) for r in runs])
            if key != "KenLM":
                s["difference"] = s["mean"] - float(np.mean(
                    [score(scorers[p], "bleu", r["stats"][p]["bleu"]) for r in base]))
                s["p_value"] = mean_pair_bootstrap(
                    scorers[p], "bleu", [r["stats"][p]["bleu"] for r in base],
                    [r["stats"][p]["bleu"] for r in runs], args.bootstrap)
            entry[p] = s
        entry["weights"] = [r["weights"] for r in runs]
        out[key] = entry
    print(f"{args.kbest}-best rescoring, {args.algorithm.upper()} x{args.seeds} seeds "
          f"({args.restarts} restarts for MERT), "
          "tokenised BLEU, mean ± sd (min-max); p: paired bootstrap of the means vs KenLM")
    print(f"{'features':<28} {'dev':>26} {'diff':>6} {'p':>6} {'test':>26} {'diff':>6} {'p':>6}")
    for key, e in out.items():
        cells = []
        for p in ("dev", "test"):
            s = e[p]
            cells.append(f"{s['mean']:.2f} ± {s['sd']:.2f} ({s['min']:.2f}-{s['max']:.2f})".rjust(26)
                         + (f" {s['difference']:+6.2f} {s['p_value']:6.3f}" if "p_value" in s
                            else " " * 14))
        print(f"{key:<28} " + " ".join(cells))
    print()
    print(markdown(out))
    if args.json:
        from nlmfeature.io.atomicfile import atomic_write_text

        atomic_write_text(args.json, json.dumps(dict(models=models, algorithm=args.algorithm,
                                                     seeds=args.seeds,
                                                     restarts=args.restarts, results=out),
                                                indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
