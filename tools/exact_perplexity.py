#!/usr/bin/env python3
"""Exactly normalised test perplexity of unnormalised (self-normalised, NCE) models, joint or
target-only: every token's raw score minus log Z of its context, Z summed over the whole target
vocabulary.  ``nlmfeature perplexity`` reports raw scores for unnormalised models (their
self-normalisation is only approximate); this tool gives the true figure beside the raw one and
the mean and spread of log Z (how well the model self-normalises).  Normalised models (softmax,
class, tree) come out unchanged (log Z = 0 up to rounding).

    python3 tools/exact_perplexity.py --test test.en [--source test.de --alignment test.align] \\
        MODEL [MODEL ...] [--json out.json]

A joint model needs --source and --alignment; a target-only model ignores them.  Models with
direct n-gram features are normalised through ``score_batch`` of every word (slower).  The
work is N x V scores (test2016: 14,058 x 5,895, about a minute per model on one core).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from nlmfeature import load  # noqa: E402
from nlmfeature.core.forward import logsumexp_rows  # noqa: E402
from nlmfeature.core.joint import JointModel  # noqa: E402
from nlmfeature.io.textio import read_lines  # noqa: E402
from nlmfeature.training.kenlm_baseline import nlm_log_scores  # noqa: E402

BLOCK = 256      # contexts per block: BLOCK x V float32 scores in memory at a time


def ngrams(model, targets, sources=None, alignments=None):
    """(contexts, words) of every target token and </s> of the test set."""
    cs, ws = [], []
    for i, tgt in enumerate(targets):
        if isinstance(model, JointModel):
            c, w = model.sentence_ngrams(sources[i], tgt, alignments[i])
        else:
            c, w = model.sentence_ngrams(tgt)
        cs.append(c)
        ws.append(w)
    return np.concatenate(cs), np.concatenate(ws)


def log_normalisers(model, ctx: np.ndarray) -> np.ndarray:
    """log Z of each context over the whole target vocabulary (natural log)."""
    V = len(model.vocab)
    out = np.empty(len(ctx))
    for i in range(0, len(ctx), BLOCK):
        c = ctx[i:i + BLOCK]
        if model.header.get("direct"):
            rep = np.repeat(c, V, axis=0)
            raw = model.score_batch(rep, np.tile(np.arange(V, dtype=np.int32), len(c)))
            raw = raw.reshape(len(c), V)
            out[i:i + BLOCK] = logsumexp_rows(np.asarray(raw, dtype=np.float64))
        else:
            raw, offset = nlm_log_scores(model, c)
            out[i:i + BLOCK] = logsumexp_rows(raw) - offset
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="model files (.nlm)")
    ap.add_argument("--test", required=True, help="tokenised target test text")
    ap.add_argument("--source", help="its source side (joint models)")
    ap.add_argument("--alignment", help="its word alignment, i-j points (joint models)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    targets = read_lines(args.test)
    sources = read_lines(args.source) if args.source else None
    aligns = read_lines(args.alignment) if args.alignment else None
    rows = []
    for path in args.models:
        model = load(path)
        if isinstance(model, JointModel) and (sources is None or aligns is None):
            sys.exit(f"{path} is a joint model: give --source and --alignment")
        ctx, words = ngrams(model, targets, sources, aligns)
        raw = np.asarray(model.score_batch(ctx, words), dtype=np.float64)
        logz = log_normalisers(model, ctx)
        row = dict(model=os.path.abspath(path), joint=isinstance(model, JointModel),
                   output=model.output_type, tokens=int(len(words)),
                   raw_perplexity=math.exp(-raw.mean()),
                   exact_perplexity=math.exp(-(raw - logz).mean()),
                   log_z_mean=float(logz.mean()), log_z_sd=float(logz.std()))
        rows.append(row)
        print(f"{path}: {row['tokens']} tokens, exact perplexity {row['exact_perplexity']:.3f} "
              f"(raw scores: {row['raw_perplexity']:.3f}; log Z mean {row['log_z_mean']:+.3f}, "
              f"sd {row['log_z_sd']:.3f})", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(dict(test=args.test, source=args.source, alignment=args.alignment,
                           rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
