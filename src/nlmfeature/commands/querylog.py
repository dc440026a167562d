"""``nlmfeature querylog``: pack a decoder's recorded query log, or describe one."""
from __future__ import annotations

import argparse

from nlmfeature.io.atomicfile import check_output
from nlmfeature.core.model import load
from nlmfeature.decoder import querylog


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("querylog", help="pack or describe a decoder query log",
                       description="Decoder query logs are recorded by running a decoder with "
                                   "NLMFEATURE_QUERY_LOG=DIR (one raw file per scoring session). "
                                   "'pack' makes a portable .qlog.xz of one; 'info' describes a packed one. "
                                   "`nlmfeature bench query --decoder-stream FILE` replays it.")
    qs = p.add_subparsers(dest="querylog_command", required=True, metavar="{pack,info}")
    pk = qs.add_parser("pack", help="pack a raw decoder recording (NLMFEATURE_QUERY_LOG) into a "
                                     "portable .qlog.xz",
                       description="Convert a raw queries.*.bin recording into a self-contained, "
                                   "xz-compressed .qlog.xz (vocabulary as words, lookups per sentence).")
    pk.add_argument("raw", help="a raw recording DIR/queries.<pid>.<n>.bin")
    pk.add_argument("--model", "-m", required=True, help="the model the decoder used while recording (for its words)")
    pk.add_argument("-o", "--output", "--out", dest="out", required=True, help="the .qlog.xz file to write")
    pk.add_argument("--sentences", type=int, default=0, help="keep only the first N sentences (default all)")
    pk.add_argument("--note", default="", help="provenance text stored in the file (system, command, data)")
    pk.set_defaults(func=run_pack)
    inf = qs.add_parser("info", help="describe a .qlog.xz: lookups, distinct n-grams and contexts "
                                      "(what per-sentence caches can save)",
                        description="Print the sentences, lookups and the fractions of distinct n-grams, "
                                    "contexts and (with a class-factored --model) (context, class) pairs: "
                                    "what exact per-sentence caches can at best save.")
    inf.add_argument("log", help="a .qlog.xz file (default: the bundled Moses stream)", nargs="?")
    inf.add_argument("--model", "-m", help="a class-factored model whose classes give the (context, class) fraction")
    inf.set_defaults(func=run_info)


def run_pack(args: argparse.Namespace) -> int:
    check_output(args.out, "--out")
    model = load(args.model)
    log = querylog.read_raw(args.raw, model.vocab.words)
    if args.sentences:
        log = log.head(args.sentences)
    size = querylog.pack(log, args.out, args.note)
    print(f"{args.out}: {len(log.sentence_starts)} sentences, {log.lookups:,} lookups, {size:,} bytes")
    return 0


def run_info(args: argparse.Namespace) -> int:
    path = args.log or querylog.BUNDLED_MOSES_STREAM
    log = querylog.read_packed(path)
    word_class = None
    if args.model:
        model = load(args.model)
        if "class.of_word" in model.arrays:
            ids = [model.vocab.id(w) for w in log.words]
            word_class = model.arrays["class.of_word"][ids]
    print(f"file          {path}\norder         {log.order}\nvocabulary    {len(log.words)} words\n"
          f"sentences     {len(log.sentence_starts)}\nlookups       {log.lookups:,}")
    for k, v in querylog.distinct_fractions(log, word_class).items():
        if k != "lookups":
            print(f"distinct {k:<13s} {v:.3f} of the lookups (per sentence)")
    if log.note:
        print(f"note          {log.note}")
    return 0
