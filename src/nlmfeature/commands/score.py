"""``nlmfeature score``: natural-log probabilities of the sentences of a text."""
from __future__ import annotations

import argparse
import math
import sys

from nlmfeature.core.model import load
from nlmfeature.io.textio import iter_lines


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score sentences (natural-log probability per line)",
                       description="Print one line per input sentence: its total log-probability, "
                                   "or with --per-word each token's score (including </s>).")
    p.add_argument("--model", "-m", required=True, help="nlmfeature model file (.nlm)")
    p.add_argument("--input", "-i", default="-", help="tokenised text, one sentence per line "
                   "(plain, .gz, or - for standard input; default -)")
    p.add_argument("--per-word", action="store_true",
                   help="print 'word=score' for every token and </s> instead of the total")
    p.add_argument("--log10", action="store_true",
                   help="print base-10 logs (as KenLM's query) instead of natural logs")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the model checksum check when loading (faster start on big models)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model = load(args.model, verify=not args.no_verify)
    scale = 1 / math.log(10) if args.log10 else 1.0
    out = sys.stdout
    for _, line in iter_lines(args.input, stream=True):
        toks = line.split()
        scores = model.score_sentence(toks) * scale
        if args.per_word:
            out.write(" ".join(f"{w}={s:.6f}" for w, s in zip(toks + ["</s>"], scores)) + "\n")
        else:
            out.write(f"{scores.sum():.6f}\n")
    return 0
