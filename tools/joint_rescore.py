#!/usr/bin/env python3
"""Rescoring gain of a joint model (docs/joint.md, "Rescoring"): real Moses 100-best lists of
dev and test2016, each hypothesis word-aligned to its source, get the target-only NLM and the
joint NNJM feature; reranking weights are tuned by MERT on dev for each feature set (KenLM
system alone, +NLM, +NNJM, +both) and test2016 BLEU of the reranked 1-best is reported.

Alignments: with ``--moses-alignments`` the lists already carry Moses'
``-print-alignment-info-in-n-best`` field; otherwise every hypothesis is force-aligned with
fast_align models trained by the recipe of the training alignment (``fast_align -d -o -v -p``
both directions, then ``atools -c grow-diag-final-and``), as ``force_align.py`` does.

``--t2s MODEL`` adds the inverse joint model (``train --target-to-source``: log p(source |
hypothesis)) as the feature ``T2S`` and the sets +NLM+T2S and +NLM+NNJM+T2S; ``--seeds 1,2,3``
tunes every set once per MERT seed and reports the mean, spread and a paired bootstrap of the
means (:func:`nlmfeature.bench.mt.mean_pair_bootstrap`).

Example (the figures in docs/joint.md)::

    python3 tools/joint_rescore.py --workdir W --joint joint.nlm --lm lm.nlm \\
        --fast-align /path/to/fast_align/build --fwd W/fwd.params --fwd-err W/fwd.err \\
        --rev W/rev.params --rev-err W/rev.err
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys

from nlmfeature.bench import shared_data

NB = shared_data("nbest", "moses-multi30k-de-en")


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p.stdout


def lines(path):
    from nlmfeature.io.textio import read_lines  # the package's one text reader
    return read_lines(path)


def err_params(path):
    T = m = None
    for line in open(path):
        if "expected target length" in line:
            m = line.split()[-1]
        elif "final tension" in line:
            T = line.split()[-1]
    return T, m


def force_align(args, nbest, src, out):
    """Append a grow-diag-final-and alignment field to every line of ``nbest``."""
    kb, sources = lines(nbest), lines(src)
    pairs = os.path.join(args.workdir, os.path.basename(out) + ".pairs")
    with open(pairs, "w", encoding="utf-8") as f:
        for line in kb:
            p = line.split(" ||| ")
            hyp = p[1].strip() or "<empty>"
            f.write(f"{sources[int(p[0])]} ||| {hyp}\n")
    fa, at = os.path.join(args.fast_align, "fast_align"), os.path.join(args.fast_align, "atools")
    res = {}
    for d, params, err in (("fwd", args.fwd, args.fwd_err), ("rev", args.rev, args.rev_err)):
        T, m = err_params(err)
        cmd = [fa, "-i", pairs, "-d", "-T", T, "-m", m, "-f", params] + (["-r"] if d == "rev" else [])
        path = f"{pairs}.{d}"
        with open(path, "w") as f:
            f.write("".join(l.split("|||")[2].strip() + "\n" for l in run(cmd).splitlines()))
        res[d] = path
    gdfa = run([at, "-i", res["fwd"], "-j", res["rev"], "-c", "grow-diag-final-and"]).splitlines()
    assert len(gdfa) == len(kb), (len(gdfa), len(kb))
    with gzip.open(out, "wt", encoding="utf-8") as f:
        for line, al in zip(kb, gdfa):
            f.write(f"{line} ||| {al.strip()}\n")


def strip_features(src, dst, drop):
    pat = re.compile(r" (%s)= \S+" % "|".join(drop)) if drop else None
    with gzip.open(src, "rt", encoding="utf-8") as f, gzip.open(dst, "wt", encoding="utf-8") as g:
        for line in f:
            p = line.split(" ||| ")
            if pat:
                p[2] = pat.sub("", p[2])
            g.write(" ||| ".join(p[:4]) + "\n")


def rerank(matrix, weights, out):
    """The 1-best of a k-best list (a ``bench.mt.KbestMatrix``) under the weights file
    ``weights``, written to ``out``, one line per sentence."""
    from nlmfeature.io.atomicfile import atomic_write_text
    from nlmfeature.mt.weights import read_weights

    atomic_write_text(out, "".join(t + "\n" for t in matrix.one_best(read_weights(weights))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--joint", required=True, help="joint model (.nlm)")
    ap.add_argument("--lm", required=True, help="target-only model (.nlm)")
    ap.add_argument("--dev-nbest", default=f"{NB}/dev.iter4.100best.gz")
    ap.add_argument("--test-nbest", default=f"{NB}/test.tuned.100best.gz")
    ap.add_argument("--dev-src", default=f"{NB}/dev.src.de.gz")
    ap.add_argument("--test-src", default=f"{NB}/test.src.de.gz")
    ap.add_argument("--dev-ref", default=f"{NB}/dev.ref.en.gz")
    ap.add_argument("--test-ref", default=f"{NB}/test.ref.en.gz")
    ap.add_argument("--init", default=f"{NB}/moses.tuned.ini", help="initial weights (moses.ini)")
    ap.add_argument("--moses-alignments", action="store_true",
                    help="the lists already carry Moses' word-alignment field")
    ap.add_argument("--fast-align", help="directory with fast_align and atools")
    ap.add_argument("--fwd"), ap.add_argument("--fwd-err"), ap.add_argument("--rev"), ap.add_argument("--rev-err")
    ap.add_argument("--t2s", help="inverse joint model (train --target-to-source), feature T2S")
    ap.add_argument("--seeds", default="0", help="MERT seeds, comma-separated (default 0: one tuning)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    W = args.workdir
    seeds = [int(x) for x in args.seeds.split(",")]
    feats = ["NLM", "NNJM"] + (["T2S"] if args.t2s else [])
    sets = {"dev": (args.dev_nbest, args.dev_src, args.dev_ref), "test": (args.test_nbest, args.test_src, args.test_ref)}
    for name, (nb, src, _) in sets.items():
        aligned = f"{W}/{name}.aligned.100best.gz"
        if not os.path.exists(aligned):
            if args.moses_alignments:
                aligned = nb
            else:
                force_align(args, nb, src, aligned)
        resc = f"{W}/{name}.resc.100best.gz"
        if not os.path.exists(resc):
            models = ["-m", args.lm, "-m", args.joint] + (["-m", args.t2s] if args.t2s else [])
            run([sys.executable, "-m", "nlmfeature.mt.rescore", "-q", *models,
                 *[x for f in feats for x in ("--name", f)], "--source", src, "-i", aligned, "-o", resc,
                 "--jobs", str(args.jobs)])
    init = [l for l in lines(args.init)]
    weights = init[init.index("[weight]") + 1:] if "[weight]" in init else init
    weights = [l for l in weights if "=" in l and not l.startswith("#")]
    from nlmfeature.bench.mt import KbestMatrix, Scorer, mean_pair_bootstrap, score, summarise

    scorers = {name: Scorer(ref, ref, "en") for name, (_, _, ref) in sets.items()}
    configs = [("kenlm", []), ("nlm", ["NLM"]), ("nnjm", ["NNJM"]), ("nlm+nnjm", ["NLM", "NNJM"])]
    if args.t2s:
        configs += [("nlm+t2s", ["NLM", "T2S"]), ("nlm+nnjm+t2s", ["NLM", "NNJM", "T2S"])]
    results, runs = {}, {}
    for cfg, keep in configs:
        drop = [x for x in feats if x not in keep]
        for name in sets:
            strip_features(f"{W}/{name}.resc.100best.gz", f"{W}/{name}.{cfg}.100best.gz", drop)
        with open(f"{W}/init.{cfg}", "w") as f:
            f.write("\n".join(weights + [f"{x}= 0.1" for x in keep]) + "\n")
        runs[cfg] = {name: [] for name in sets}
        matrices = {name: KbestMatrix(f"{W}/{name}.{cfg}.100best.gz") for name in sets}
        for seed in seeds:
            tag = cfg if seed == 0 else f"{cfg}.seed{seed}"
            run([sys.executable, "-m", "nlmfeature.mt.tuning.cli", "optimise", "--quiet", "--nbest",
                 f"{W}/dev.{cfg}.100best.gz", "--init", f"{W}/init.{cfg}", "--ref", sets["dev"][2],
                 "--out", f"{W}/tuned.{tag}", "--jobs", str(args.jobs), "--seed", str(seed)])
            for name in sets:
                rerank(matrices[name], f"{W}/tuned.{tag}", f"{W}/{name}.{tag}.1best")
                runs[cfg][name].append(scorers[name].stats(f"{W}/{name}.{tag}.1best")["bleu"])
        results[cfg] = {name: summarise([score(scorers[name], "bleu", r) for r in runs[cfg][name]])
                        for name in sets}
        d, t = results[cfg]["dev"], results[cfg]["test"]
        print(f"{cfg:13s} dev {d['mean']:6.2f} (sd {d['sd']:.2f})  test2016 {t['mean']:6.2f} (sd {t['sd']:.2f}, "
              f"{t['min']:.2f}-{t['max']:.2f}; {len(seeds)} tuning(s))", flush=True)
    pairs = [("nlm", "kenlm"), ("nnjm", "kenlm"), ("nlm+nnjm", "kenlm"), ("nlm+nnjm", "nlm")]
    if args.t2s:
        pairs += [("nlm+t2s", "nlm"), ("nlm+nnjm+t2s", "nlm"), ("nlm+nnjm+t2s", "nlm+nnjm"), ("nlm+nnjm+t2s", "kenlm")]
    for cfg, base in pairs:
        r = {}
        for name in sets:
            gain = results[cfg][name]["mean"] - results[base][name]["mean"]
            p = mean_pair_bootstrap(scorers[name], "bleu", runs[base][name], runs[cfg][name], 1000)
            r[name] = {"gain": gain, "p": p}
        results[f"{cfg} vs {base}"] = r
        print(f"{cfg} vs {base}: dev {r['dev']['gain']:+.2f} (p = {r['dev']['p']:.3f}), "
              f"test2016 {r['test']['gain']:+.2f} BLEU (paired bootstrap of the means, p = {r['test']['p']:.3f})",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
