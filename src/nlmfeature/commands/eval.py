"""``nlmfeature eval`` and its alias ``nlmfeature-eval``: the flags; the work is
:mod:`nlmfeature.mt.evaluate`'s."""
from __future__ import annotations

import argparse
from typing import List, Optional

from nlmfeature.commands.base import standalone
from nlmfeature.mt import evaluate


def build_parser(sub: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """The argument parser of ``nlmfeature-eval``, or with ``sub`` the ``eval`` subcommand of
    ``nlmfeature`` (the same flags)."""
    p = (sub.add_parser if sub is not None else argparse.ArgumentParser)(
        *(["eval"] if sub is not None else []),
        **({"help": "sacrebleu BLEU and chrF with signatures; with two systems the "
                  "paired-bootstrap p-value of the difference"}
           if sub is not None else {"prog": "nlmfeature-eval"}),
        description="Corpus BLEU and chrF of one system output (sacrebleu, with signatures); "
                    "with two, paired bootstrap resampling gives the p-value of the difference "
                    "(the first system is the baseline).",
        epilog="Example: nlmfeature eval --ref test.ref.en base.1best nlm.1best")
    p.add_argument("systems", nargs="*", metavar="SYS",
                   help="system output(s), one sentence per line (plain, .gz or -); one, or two "
                        "to compare (baseline first); or give them with -i")
    p.add_argument("-i", "--input", nargs="+", default=[], metavar="SYS",
                   help="system output(s), as the positional SYS (sacrebleu's spelling)")
    p.add_argument("-r", "--ref", action="append", required=True, metavar="REF",
                   help="reference translation, line-aligned with the systems; repeat for "
                        "several references")
    p.add_argument("-tok", "--tokenize", default=evaluate.DEFAULT_TOKENIZE,
                   help=f"sacrebleu BLEU tokenizer: none (for text tokenised already, as the "
                        f"decoders' output and the k-best lists; what tuning uses), 13a (for "
                        f"detokenised text), intl, char, zh, ... (default {evaluate.DEFAULT_TOKENIZE}, "
                        f"the same as nlmfeature tune; with --detok, none means 13a)")
    p.add_argument("-lc", "--lowercase", action="store_true",
                   help="case-insensitive scores (lowercase systems and references)")
    p.add_argument("-m", "--metrics", nargs="+", default=list(evaluate.METRICS), metavar="METRIC",
                   help="metrics among bleu and chrf, as sacrebleu takes them (-m bleu chrf) "
                        "or comma-separated (default both)")
    p.add_argument("--chrf-word-order", type=int, default=0, metavar="N",
                   help="word n-gram order of chrF (0: chrF, default; 2: chrF++)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="paired bootstrap resamples when comparing two systems (default 1000; "
                        "0 skips the test)")
    p.add_argument("--seed", type=int, default=12345,
                   help="random seed of the resampling (default 12345, as sacrebleu)")
    p.add_argument("--sentence-level", action="store_true",
                   help="also print each sentence's BLEU (effective order, exp smoothing) and chrF")
    p.add_argument("--detok", nargs="?", const="en", default=None, metavar="LANG",
                   help="BLEU as papers report it: detokenise the (Moses-tokenised) system "
                        "outputs with sacremoses (language LANG, default en) and score them "
                        "against raw, untokenised references with --tokenize (13a by default). "
                        "Add --lowercase when the outputs are lowercased")
    p.add_argument("--tok-ref", action="append", default=[], metavar="REF",
                   help="with --detok: also score the outputs as they are against these "
                        "tokenised references (--tokenize none), printed beside the "
                        "detokenised scores")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--width", type=int, default=2, metavar="N",
                   help="decimals of the printed scores (default 2)")
    p.set_defaults(func=evaluate.run)
    return p


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``eval`` to the ``nlmfeature`` subcommands."""
    build_parser(sub)


def main(argv: Optional[List[str]] = None) -> int:
    """``nlmfeature-eval``: the command on its own (also called from Python)."""
    return standalone(build_parser, argv)
