"""``nlmfeature corpus``: compiled corpora (compile, info) and the Gutenberg book corpus."""
from __future__ import annotations

import argparse
import json
import sys
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("corpus", help="compile text into a memory-mapped corpus; build the Gutenberg corpus",
                       description="Compiled corpora: tokenised text of any size as a memory-mapped, "
                                   "checksummed file of word ids that train reads with bounded memory.")
    s = p.add_subparsers(dest="corpus_command", metavar="ACTION")
    s.required = True
    c = s.add_parser("compile", help="compile a tokenised text (plain, .gz, .bz2, .xz)",
                     description="One streaming pass over a tokenised text (one sentence per line) "
                                 "writes its vocabulary with counts and its word ids. Memory grows "
                                 "with the vocabulary, not the text. A second run on the same "
                                 "unchanged text reuses the file. train --train accepts the result.")
    c.add_argument("-i", "--input", required=True, metavar="TEXT", help="tokenised text")
    c.add_argument("-o", "--output", required=True, metavar="CORPUS",
                   help="the compiled corpus to write (atomically), conventionally NAME.nlmcorpus")
    c.add_argument("--force", action="store_true", help="compile again even if OUTPUT is up to date")
    c.add_argument("--json", action="store_true", help="print the summary as JSON")
    c.set_defaults(func=run_compile)
    i = s.add_parser("info", help="check a compiled corpus and print its summary",
                     description="Open a compiled corpus, verify it completely (sizes, checksums, "
                                 "ids) and print what it holds.")
    i.add_argument("corpus", metavar="CORPUS", help="a compiled corpus")
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    i.set_defaults(func=run_info)
    g = s.add_parser("gutenberg", help="build an English LM corpus from Project Gutenberg books",
                     description="Turn a folder (or git repository) of Project Gutenberg plain-text "
                                 "books into train/valid/test text: licence header and footer "
                                 "stripped, paragraphs joined, sentences split, each prepared as "
                                 "'nlmfeature prepare' does (normalise, tokenise -a, lowercase). "
                                 "Whole books are held out for valid and test.")
    g.add_argument("-i", "--input", required=True, metavar="BOOKS",
                   help="folder of books (Author/Title.txt), or a git repository of them (read from "
                        "HEAD without a work tree)")
    g.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="output folder: train.txt, valid.txt, test.txt and books.tsv are written there")
    g.add_argument("--heldout-books", type=int, default=5, metavar="N",
                   help="books for valid.txt and as many for test.txt (default 5)")
    g.add_argument("--books", type=int, default=0, metavar="N",
                   help="keep only N training books, a sample across authors (default 0: all)")
    g.add_argument("--jobs", "-j", type=int, default=2, metavar="J",
                   help="worker processes (default 2)")
    g.set_defaults(func=run_gutenberg)


def _summary(corpus) -> dict:
    h = corpus.header
    return {"path": corpus.path, "tokens": h["tokens"], "sentences": h["sentences"], "types": h["types"],
            "blocks": h["blocks"], "bytes": h["file_bytes"], "source": h["source"]}


def _print(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{summary['path']}: {summary['tokens']:,} tokens, {summary['sentences']:,} sentences, "
          f"{summary['types']:,} word types, {summary['bytes'] / 2**20:.1f} MiB "
          f"(from {summary['source']['path']})")


def run_compile(args: argparse.Namespace) -> int:
    from nlmfeature.training.corpusfile import compile_corpus

    t0 = time.time()
    log = (lambda n: None) if args.quiet else (
        lambda n: print(f"{args.input}: {n:,} tokens [{time.time() - t0:.0f}s]", file=sys.stderr, flush=True))
    corpus = compile_corpus(args.input, args.output, reuse=not args.force, progress=log)
    s = _summary(corpus)
    s["seconds"] = round(time.time() - t0, 2)
    _print(s, args.json)
    return 0


def run_info(args: argparse.Namespace) -> int:
    from nlmfeature.training.corpusfile import CompiledCorpus

    _print(_summary(CompiledCorpus(args.corpus)), args.json)
    return 0


def run_gutenberg(args: argparse.Namespace) -> int:
    from nlmfeature.errors import NLMFeatureError
    from nlmfeature.training.gutenberg import build

    if args.heldout_books < 1 or args.books < 0 or args.jobs < 1:
        raise NLMFeatureError("--heldout-books and --jobs must be >= 1, --books >= 0")
    log = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    tokens = build(args.input, args.output, args.heldout_books, args.jobs, args.books, log)
    print(json.dumps(tokens))
    return 0
