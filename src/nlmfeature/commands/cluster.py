"""``nlmfeature cluster``: Brown clustering of a text into Liang's paths format."""
from __future__ import annotations

import argparse
import time

from nlmfeature.training.clusters import (brown_clusters_corpus, frequency_binning_ami_corpus,
                                          write_paths)
from nlmfeature.io.atomicfile import check_output
from nlmfeature.commands.base import MAX_INT, Number
from nlmfeature.io.jsonout import dumps_json
from nlmfeature.errors import NLMFeatureError
from nlmfeature.commands import DEFAULT_THREADS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cluster", help="Brown word clusters for class-factored output layers (--class-file)",
        description="Brown clustering (Brown et al. 1992) with Liang's windowed algorithm: words "
                    "enter by decreasing frequency, the C+1 clusters of the window lose the least "
                    "average mutual information (AMI) by each merge, and the last C clusters are "
                    "merged into a binary hierarchy whose root-to-cluster paths are the bitstrings. "
                    "Writes Liang's wcluster paths format: bitstring<TAB>word<TAB>count. The text "
                    "is one stream of tokens (bigrams cross line ends, as in wcluster).  The text is read "
                    "through its compiled corpus (as by nlmfeature train): memory holds the "
                    "vocabulary and the distinct bigrams, never the text.")
    p.add_argument("-i", "--input", "--text", dest="text", required=True, metavar="FILE",
                   help="training text, one sentence per line, whitespace-tokenised (plain, .gz, "
                        ".bz2 or .xz), or a compiled corpus (nlmfeature corpus compile); a text is "
                        "compiled into --corpus-dir on first use and reused while unchanged")
    p.add_argument("--corpus-dir", metavar="DIR", default="",
                   help="where a text is compiled (default $XDG_CACHE_HOME/nlmfeature/corpora, "
                        "i.e. ~/.cache/nlmfeature/corpora)")
    p.add_argument("--classes", "-c", type=Number(int, 1, MAX_INT), default=None, metavar="C",
                   help="number of clusters (default: round(sqrt(V)) for the V clustered words)")
    p.add_argument("--min-count", type=Number(int, 1, MAX_INT), default=1, metavar="N",
                   help="cluster only words occurring at least N times; bigrams with rarer words "
                        "are ignored, and --class-file users place such words by frequency "
                        "(default 1: every word)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS, metavar="T",
                   help=f"threads for the loss-table updates (default {DEFAULT_THREADS}). The parallel loops "
                        "are short (one per merge), so extra threads pay only on an idle "
                        "machine, and cost CPU on a busy one. The result does not depend on T")
    p.add_argument("-o", "--output", "--out", dest="out", required=True, metavar="PATHS",
                   help="output paths file (written atomically)")
    p.add_argument("--compare-frequency-binning", action="store_true",
                   help="also report the AMI of frequency binning with the same C")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON instead of text")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.classes is not None and args.classes < 1:
        raise NLMFeatureError(f"--classes must be positive (got {args.classes})")
    if args.min_count < 1:
        raise NLMFeatureError(f"--min-count must be at least 1 (got {args.min_count})")
    if args.threads < 1:
        raise NLMFeatureError(f"--threads must be at least 1 (got {args.threads})")
    from nlmfeature.training.corpusfile import open_corpus

    check_output(args.out, "--out")           # before hours of clustering
    corpus = open_corpus(args.text, args.corpus_dir or None)
    start = time.perf_counter()
    bar = None
    if not args.quiet:
        from nlmfeature.io.progress import progress

        n_words = int((corpus.counts[1:] >= args.min_count).sum())
        bar = progress(total=n_words, unit="word", desc="clustering")
    try:
        result = brown_clusters_corpus(corpus, args.classes, args.min_count, args.threads,
                                       progress=bar.update if bar else None)
    finally:
        if bar:
            bar.close()
    seconds = time.perf_counter() - start
    write_paths(args.out, result.entries)
    summary = {"text": args.text, "out": args.out, "words": result.words, "tokens": result.tokens,
               "bigrams": result.bigrams, "classes": result.n_classes,
               "ami_bits": round(result.ami_bits, 6), "seconds": round(seconds, 2)}
    if args.compare_frequency_binning:
        summary["frequency_binning_ami_bits"] = round(
            frequency_binning_ami_corpus(corpus, result.n_classes, args.min_count), 6)
    if args.json:
        print(dumps_json(summary, indent=2))
    else:
        for key, value in summary.items():
            print(f"{key:28s} {value}")
    return 0

