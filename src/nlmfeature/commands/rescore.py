"""``nlmfeature rescore`` and its alias ``nlmfeature-rescore``: the flags; the work is
:mod:`nlmfeature.mt.rescore`'s."""
from __future__ import annotations

import argparse
from typing import List, Optional

from nlmfeature.commands.base import MAX_INT, Number, standalone
from nlmfeature.mt import rescore
from nlmfeature.mt.kbest import FORMATS


def build_parser(sub: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """The argument parser of ``nlmfeature-rescore``, or with ``sub`` the ``rescore``
    subcommand of ``nlmfeature`` (the same flags)."""
    p = (sub.add_parser if sub is not None else argparse.ArgumentParser)(
        *(["rescore"] if sub is not None else []),
        **({"help": "append NLM features (NLM0= log-prob, NLMOOV0= OOV count) to Moses / cdec "
                  "k-best lists, streaming, gzip in/out; rerank to the 1-best"}
           if sub is not None else {"prog": "nlmfeature-rescore"}),
        description="Append neural-LM features (sentence natural-log probability, optionally an "
                    "OOV count) to every hypothesis of a Moses or cdec k-best list; optionally "
                    "rerank with weights and write the 1-best.",
        epilog="Example: nlmfeature rescore -m lm.nlm -i dev.100best.gz -o dev.nlm.100best.gz "
               "--jobs 2;  reranking: ... --weights moses.ini --one-best dev.1best")
    p.add_argument("-m", "--model", action="append", default=[], metavar="MODEL",
                   help="nlmfeature model file; repeat for several models (features NLM0, NLM1, "
                        "...); without any, --weights --one-best reranks the list as it is")
    p.add_argument("-i", "--input", default="-", metavar="KBEST",
                   help="k-best list to rescore (plain, .gz, or - for standard input; default -)")
    p.add_argument("-o", "--output", default=None, metavar="OUT",
                   help="where to write the rescored k-best list (.gz compresses; - is standard "
                        "output).  Default: standard output, or nothing when --one-best is given")
    p.add_argument("--format", default="auto", choices=("auto",) + FORMATS,
                   help="k-best format: moses ('Name= v ...'), moses-old ('name: v ...'), cdec "
                        "('name=value'), or auto (decide from the first line; default)")
    p.add_argument("--name", action="append", metavar="NAME",
                   help="name of the log-probability feature of each --model, in order (default "
                        "NLM0, NLM1, ...); no '_' allowed (Moses' mert reads those as sparse)")
    p.add_argument("--oov-feature", action="store_true",
                   help="also add, per model, the count of hypothesis tokens not in its "
                        "vocabulary (NLMOOV0, ... or NAMEOOV with --name)")
    p.add_argument("--oov-name", action="append", metavar="NAME",
                   help="name of the OOV-count feature of each --model (with --oov-feature)")
    p.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="worker processes (each maps the model; output keeps the input order; "
                        "default 1)")
    p.add_argument("--chunk-size", type=Number(int, 1, MAX_INT), default=2000, metavar="N",
                   help="hypotheses per work unit (whole sentences; default 2000); at most "
                        "2 x jobs units are in memory at once")
    p.add_argument("--batch-size", type=Number(int, 1, 1 << 24), default=8192, metavar="N",
                   help="n-grams per matrix-product batch of the scorer (default 8192)")
    p.add_argument("--source", metavar="FILE",
                   help="joint models (trained with train --source): the source sentences of the "
                        "list, tokenised as for training, line i = sentence id i; each hypothesis "
                        "needs its word alignment (Moses -print-alignment-info-in-n-best)")
    p.add_argument("--weights", metavar="FILE",
                   help="feature weights for reranking: a moses.ini ([weight] section) or a "
                        "'Name= v1 v2 ...' / 'name value' file; include the new features' weights")
    p.add_argument("--one-best", metavar="OUT",
                   help="with --weights: write the highest-scoring hypothesis of each sentence, one "
                        "line per sentence id (an empty line for an id missing from the list)")
    p.add_argument("--update-total", action="store_true",
                   help="with --weights: replace each line's total score by the weighted sum")
    p.add_argument("--sentences", type=int, metavar="N",
                   help="number of input sentences: with --one-best, ids missing at the end of "
                        "the list also get empty lines, and an id >= N is an error.  Without it "
                        f"at most {rescore.MAX_MISSING} missing ids are padded (a list whose ids jump "
                        "further, e.g. a corrupt id, is refused)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip malformed lines (counted and reported at the end) instead of "
                        "stopping with an error naming the file and line")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the model checksum check when loading")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=rescore.run)
    return p


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``rescore`` to the ``nlmfeature`` subcommands."""
    build_parser(sub)


def main(argv: Optional[List[str]] = None) -> int:
    """``nlmfeature-rescore``: the command on its own (also called from Python)."""
    return standalone(build_parser, argv)
