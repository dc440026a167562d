#!/usr/bin/env python3
"""Rescoring gain of a joint model (docs/joint.md, "Rescoring"): real Moses 100-best lists of
dev and test2016, each hypothesis word-aligned to its source, get the target-only NLM and the
joint NNJM feature; reranking weights are tuned by MERT on dev for each feature set (KenLM
system alone, +NLM, +NNJM, +both) and test2016 BLEU of the reranked 1-best is reported.

Alignments: with ``--moses-alignments`` the lists already carry Moses'
``-print-alignment-info-in-n-best`` field; otherwise every hypothesis is force-aligned with
fast_align models trained by the recipe of the training alignment (``fast_align -d -o -v -p``
both directions, then ``atools -c grow-diag-final-and``), as ``force_align.py`` does.

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


def rerank(nbest, weights, out):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    from nlmfeature.mt.kbest import read_kbest
    from nlmfeature.mt.weights import read_weights

    w = read_weights(weights)
    best = {}
    for h in read_kbest(nbest):
        s = sum(a * b for lbl, vals in h.features for a, b in zip(w.get(lbl) or [0.0] * len(vals), vals))
        if h.sid not in best or s > best[h.sid][0]:
            best[h.sid] = (s, h.text)
    with open(out, "w", encoding="utf-8") as f:
        for sid in range(max(best) + 1):
            f.write(best.get(sid, (0.0, ""))[1] + "\n")


def bleu(hyp, ref):
    out = run([sys.executable, "-m", "nlmfeature.mt.tuning.cli", "bleu", hyp, "--ref", ref])
    return float(out.split()[2]), out.splitlines()[0]


def paired_bootstrap(ref, base_hyp, hyp, samples=1000, seed=0):
    """(BLEU gain, p-value): Koehn 2004's paired bootstrap, the fraction of resampled test
    sets on which ``hyp`` is not better than ``base_hyp``."""
    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
    from nlmfeature.mt.bleu import References, corpus_bleu

    refs = References.from_files([ref])
    a = np.array([refs.stats(i, h) for i, h in enumerate(lines(base_hyp))])
    b = np.array([refs.stats(i, h) for i, h in enumerate(lines(hyp))])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(samples, len(a)))
    sa = corpus_bleu(a[idx].sum(axis=1))
    sb = corpus_bleu(b[idx].sum(axis=1))
    gain = float(corpus_bleu(b.sum(axis=0)[None])[0] - corpus_bleu(a.sum(axis=0)[None])[0])
    return gain, float(np.mean(sb <= sa))


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
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    W = args.workdir
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
            run([sys.executable, "-m", "nlmfeature.mt.rescore", "-q", "-m", args.lm, "-m", args.joint,
                 "--name", "NLM", "--name", "NNJM", "--source", src, "-i", aligned, "-o", resc,
                 "--jobs", str(args.jobs)])
    init = [l for l in lines(args.init)]
    weights = init[init.index("[weight]") + 1:] if "[weight]" in init else init
    weights = [l for l in weights if "=" in l and not l.startswith("#")]
    results = {}
    for cfg, keep in (("kenlm", []), ("nlm", ["NLM"]), ("nnjm", ["NNJM"]), ("nlm+nnjm", ["NLM", "NNJM"])):
        drop = [x for x in ("NLM", "NNJM") if x not in keep]
        for name in sets:
            strip_features(f"{W}/{name}.resc.100best.gz", f"{W}/{name}.{cfg}.100best.gz", drop)
        with open(f"{W}/init.{cfg}", "w") as f:
            f.write("\n".join(weights + [f"{x}= 0.1" for x in keep]) + "\n")
        run([sys.executable, "-m", "nlmfeature.mt.tuning.cli", "optimise", "--quiet", "--nbest",
             f"{W}/dev.{cfg}.100best.gz", "--init", f"{W}/init.{cfg}", "--ref", sets["dev"][2],
             "--out", f"{W}/tuned.{cfg}", "--jobs", str(args.jobs)])
        for name in sets:
            rerank(f"{W}/{name}.{cfg}.100best.gz", f"{W}/tuned.{cfg}", f"{W}/{name}.{cfg}.1best")
        results[cfg] = {name: bleu(f"{W}/{name}.{cfg}.1best", sets[name][2]) for name in sets}
        print(f"{cfg:10s} dev {results[cfg]['dev'][0]:6.2f}  test2016 {results[cfg]['test'][0]:6.2f}   "
              f"({results[cfg]['test'][1]})", flush=True)
    for cfg, base in (("nlm", "kenlm"), ("nnjm", "kenlm"), ("nlm+nnjm", "kenlm"), ("nlm+nnjm", "nlm")):
        gain, p = paired_bootstrap(sets["test"][2], f"{W}/test.{base}.1best", f"{W}/test.{cfg}.1best")
        results[f"{cfg} vs {base}"] = {"test_gain": gain, "p": p}
        print(f"test2016 {cfg} vs {base}: {gain:+.2f} BLEU, paired bootstrap p = {p:.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
