"""``nlmfeature ensemble``: several unnormalised models as one model file (their weighted sum
of scores, exactly; :mod:`nlmfeature.core.ensemble`)."""
from __future__ import annotations

import argparse
import sys

from nlmfeature.core.ensemble import write_ensemble
from nlmfeature.commands.base import Number


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ensemble", help="several unnormalised models as one model file (one decoder feature)",
        description="Write one model file whose score is the weighted sum of the members' "
                    "scores, exactly: the members' hidden vectors side by side, the output "
                    "rows and direct-feature tables weighted and added.  A decoder then "
                    "uses the ensemble as one feature with one weight (NLMFeature "
                    "path=OUTPUT), with exact state and every cache.  Members: unnormalised or "
                    "self-normalised models (nlmfeature train's default output) of one "
                    "first-layer branch and no further hidden layers (LBL, the defaults), "
                    "trained on the same text with the same vocabulary and direction; orders "
                    "may differ (the ensemble has the largest).  In Multi30k 1000-best "
                    "rescoring the mean of the default NCE model and a self-normalised "
                    "maximum-likelihood one gave +1.61 BLEU over KenLM alone where either "
                    "alone gave +1.03-1.12 (docs/joint.md).")
    p.add_argument("models", nargs="+", metavar="MODEL", help="member model files (two or more)")
    p.add_argument("-o", "--output", required=True, help="the ensemble model file to write")
    p.add_argument("--weights", type=Number(float, 0, None, lo_open=True), nargs="+", default=None, metavar="A",
                   help="one positive weight per member (default: 1/K each, the mean)")
    p.add_argument("--float16", action="store_true",
                   help="store embeddings and output weights as float16 (half the file)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    checksum = write_ensemble(args.output, args.models, args.weights, half=args.float16)
    if not args.quiet:
        print(f"nlmfeature ensemble: {args.output} ({len(args.models)} members, checksum "
              f"{checksum})", file=sys.stderr)
    return 0
