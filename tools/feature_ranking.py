"""Which k-best features tell better hypotheses from worse ones: pairwise ranking accuracy.

For every sentence of a k-best list (Moses or cdec format) the hypotheses are grouped by length
(so that no feature wins by preferring short or long outputs), up to ``--pairs`` random pairs
of each group whose smoothed sentence BLEU differs are drawn, and for every feature the share
of pairs (where the feature differs) in which the higher value belongs to the better
hypothesis is printed: 0.5 is chance.  ``--difference A B`` adds the feature A - B (e.g. a
joint model minus a target-only model: what the source sentence adds).

    python3 tools/feature_ranking.py test.1000best.gz test.ref.en --difference NNJM0 NLM0

Measured on `nlmfeature bench mt`'s 1000-best lists (docs/joint.md).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
from nlmfeature.io.textio import read_lines  # noqa: E402
from nlmfeature.mt.bleu import References, smoothed_sentence_bleu  # noqa: E402
from nlmfeature.mt.kbest import read_kbest  # noqa: E402


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kbest", help="k-best list (Moses or cdec format, .gz ok)")
    ap.add_argument("ref", help="reference, one line per sentence id (tokenised as the list)")
    ap.add_argument("--pairs", type=int, default=200, help="pairs drawn per (sentence, length) group (default 200)")
    ap.add_argument("--difference", nargs=2, action="append", default=[], metavar=("A", "B"),
                    help="also rank by feature A minus feature B (repeatable)")
    ap.add_argument("--seed", type=int, default=1, help="random seed of the pairs (default 1)")
    args = ap.parse_args(argv)

    refs = References([read_lines(args.ref)])
    sids: List[int] = []
    lens: List[int] = []
    rows: List[List[float]] = []
    stats: List[np.ndarray] = []
    names: List[str] = []
    for h in read_kbest(args.kbest):
        if not names:
            names = h.dense_names()
        elif h.dense_names() != names:
            sys.exit(f"{args.kbest}: sentence {h.sid}: features differ from the first line's")
        if h.sid >= len(refs):
            sys.exit(f"{args.kbest}: sentence id {h.sid} but {args.ref} has {len(refs)} lines")
        sids.append(h.sid)
        lens.append(len(h.text.split()))
        rows.append(h.dense())
        stats.append(refs.stats(h.sid, h.text))
    sid, length, F = np.array(sids), np.array(lens), np.array(rows)
    bleu = smoothed_sentence_bleu(np.array(stats))
    cols: Dict[str, np.ndarray] = {n: F[:, i] for i, n in enumerate(names)}
    for a, b in args.difference:
        for n in (a, b):
            if n not in cols:
                sys.exit(f"--difference: no feature {n!r} (features: {', '.join(names)})")
        cols[f"{a}-{b}"] = cols[a] - cols[b]
    rng = np.random.default_rng(args.seed)
    right = {n: 0 for n in cols}
    counted = {n: 0 for n in cols}
    order = np.lexsort((length, sid))
    keys = np.stack([sid[order], length[order]], axis=1)
    starts = np.flatnonzero(np.r_[True, np.any(keys[1:] != keys[:-1], axis=1)])
    for g in np.split(order, starts[1:]):
        if len(g) < 2:
            continue
        a = rng.choice(g, size=args.pairs)
        b = rng.choice(g, size=args.pairs)
        keep = bleu[a] != bleu[b]
        a, b = a[keep], b[keep]
        better = bleu[a] > bleu[b]
        for n, v in cols.items():
            d = v[a] - v[b]
            k = d != 0
            right[n] += int(np.sum((d[k] > 0) == better[k]))
            counted[n] += int(k.sum())
    print(f"{'feature':28s} {'accuracy':>8s} {'pairs':>9s}   (equal-length pairs, smoothed sentence BLEU; 0.5 = chance)")
    for n in sorted(cols, key=lambda n: -right[n] / max(1, counted[n])):
        if counted[n]:
            print(f"{n:28s} {right[n] / counted[n]:8.3f} {counted[n]:9d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
