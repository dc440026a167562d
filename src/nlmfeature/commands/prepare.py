"""``nlmfeature prepare``: the flags; the work is :mod:`nlmfeature.mt.prepare`'s."""
from __future__ import annotations

import argparse

from nlmfeature.mt import prepare


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``prepare`` to the ``nlmfeature`` subcommands."""
    p = sub.add_parser(
        "prepare", help="raw text -> normalised, tokenised (-a), lowercased text, as Moses' Perl",
        description="Prepare raw text as the Moses Perl pipeline does (normalize-punctuation.perl "
                    "| tokenizer.perl -a | lowercase.perl, white space collapsed), with sacremoses; "
                    "identical to the Perl output on Multi30k.  Use it for dev/test sources and "
                    "references and for NLM training text.",
        epilog="Example: nlmfeature prepare -l de -i test.de.gz -o test.tok.lc.de")
    p.add_argument("--lang", "-l", required=True,
                   help="language code of the text (en, de, fr, ...): picks the non-breaking "
                        "prefixes, apostrophe and quotation rules")
    p.add_argument("--input", "-i", default="-",
                   help="raw text, one sentence per line (plain, .gz, or - for standard input; "
                        "default -)")
    p.add_argument("--output", "-o", default="-",
                   help="where to write (plain, .gz, or - for standard output; default -); a "
                        "file is replaced only when all of it is written")
    p.add_argument("--no-aggressive", action="store_true",
                   help="do not split hyphens inside words (tokenizer.perl without -a)")
    p.add_argument("--no-lowercase", action="store_true", help="keep the case")
    p.add_argument("--no-escape", action="store_true",
                   help="do not escape & < > ' \" [ ] | (tokenizer.perl -no-escape)")
    p.add_argument("--no-normalise", action="store_true",
                   help="skip the punctuation normalisation (normalize-punctuation.perl)")
    p.add_argument("--detokenise", action="store_true",
                   help="instead: detokenise tokenised text (sacremoses' Moses detokenizer, "
                        "undoing @-@ and the escaping)")
    p.set_defaults(func=prepare.run)
