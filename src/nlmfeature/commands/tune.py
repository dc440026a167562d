"""``nlmfeature tune`` (alias ``nlmfeature-tune``): tune decoder feature weights (MERT, batch MIRA,
PRO); the flags here, the work in :mod:`nlmfeature.mt.tuning`.

Subcommands:

- ``optimise``: optimise over k-best lists already decoded (offline);
- ``moses`` / ``cdec``: decoder-in-the-loop tuning like ``mert-moses.pl`` (resumable);
- ``bleu``: corpus BLEU of a k-best list's first hypotheses or of plain text (as sacrebleu).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

import numpy as np

from nlmfeature.mt.bleu import DEFAULT_TOKENIZE, TOKENIZERS, References, bleu_summary
from nlmfeature.errors import NLMFeatureError
from nlmfeature.commands.base import MAX_INT, Number, size_bytes, standalone
from nlmfeature.commands import DEFAULT_THREADS
from nlmfeature.mt.weights import read_weights, with_new_features, write_weights
from nlmfeature.mt.tuning import ALGORITHMS, optimise_pool
from nlmfeature.mt.tuning.data import KbestPool
from nlmfeature.mt.tuning.driver import FINAL_WEIGHTS, FINAL_WEIGHTS_DEFAULT


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _add_bleu_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-r", "--ref", action="append", required=True, metavar="REF",
                   help="reference file (UTF-8, one line per sentence, .gz ok); repeat for "
                        "several references per sentence")
    p.add_argument("--tokenize", default=DEFAULT_TOKENIZE, choices=TOKENIZERS,
                   help="tokeniser applied to hypotheses and references before BLEU, as "
                        f"sacrebleu's -tok (default: {DEFAULT_TOKENIZE}, for tokenised k-best "
                        "text; the same default as nlmfeature eval)")
    p.add_argument("--lowercase", action="store_true",
                   help="case-insensitive BLEU (default: case-sensitive, as Moses' scorer)")


def _add_optimiser_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algorithm", default="mert", choices=ALGORITHMS,
                   help="optimiser: mert (Och's line search, as Moses mert), mira (batch k-best "
                        "MIRA, as Moses kbmira) or pro (pairwise ranking, as Moses pro) "
                        "(default: mert)")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed for restarts, directions, MIRA's sentence order and PRO's "
                        "sampling (default: 0)")
    p.add_argument("--restarts", type=int, default=20,
                   help="MERT: random starting points besides the initial weights (default: 20, "
                        "as mert-moses.pl)")
    p.add_argument("--random-directions", type=int, default=0, metavar="N",
                   help="MERT: random directions searched per round besides the coordinate "
                        "axes (default: 0)")
    p.add_argument("--random-range", type=float, nargs=2, default=(0.0, 1.0),
                   metavar=("LO", "HI"),
                   help="MERT: range of random starting weights (default: 0 1, as Moses)")
    p.add_argument("--polish", type=int, default=30, metavar="N",
                   help="MERT: refine the best point by random-direction line searches until N "
                        "in a row gain nothing (default: 30; 0 = exactly Moses' procedure)")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes: MERT's starting points are searched and several k-best lists "
                        "read in parallel (default: 1)")
    p.add_argument("--C", type=Number(float, 0, None, lo_open=True), default=0.01, dest="C",
                   help="MIRA: step-size cap C (default: 0.01)")
    p.add_argument("--decay", type=Number(float, 0, 1, lo_open=True), default=0.999,
                   help="MIRA: decay of the background BLEU pseudo-document (default: 0.999)")
    p.add_argument("--epochs", type=Number(int, 1, MAX_INT), default=60,
                   help="MIRA: passes over the sentences (default: 60)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars or per-start / per-epoch messages")


def _optimiser_settings(args: argparse.Namespace) -> dict:
    lo, hi = args.random_range
    if not lo < hi:
        raise NLMFeatureError(f"--random-range {lo:g} {hi:g}: LO must be below HI")
    return dict(seed=args.seed, restarts=args.restarts,
                random_directions=args.random_directions,
                random_range=tuple(args.random_range), jobs=args.jobs, polish=args.polish,
                C=args.C, decay=args.decay, epochs=args.epochs)


# -- optimise -------------------------------------------------------------------------------
def cmd_optimise(args: argparse.Namespace) -> int:
    from nlmfeature.io.atomicfile import check_output

    settings = _optimiser_settings(args)      # (checked before any list is read)

    for path, flag, stream in ((args.out, "--out", True), (args.save_pool, "--save-pool", False),
                               (args.output_1best, "--output-1best", True)):
        if path:
            check_output(path, flag, stream)   # before reading lists and optimising
    t0 = time.time()
    refs = References.from_files(args.ref, tokenize=args.tokenize, lowercase=args.lowercase)
    pool = KbestPool(refs)
    pool.add_files(args.nbest, fmt=args.format, skip_bad=args.skip_bad, jobs=args.jobs,
                   progress=not args.quiet, log=None if args.quiet else _err)
    pool.check_complete()
    if args.save_pool:
        pool.save(args.save_pool)
    init_weights = read_weights(args.init) if args.init else None
    if init_weights is None and args.algorithm != "pro":
        raise NLMFeatureError(f"--init is required for {args.algorithm}")
    if init_weights is not None:
        init_weights, added = with_new_features(pool.labels, init_weights)
        if added and not args.quiet:
            _err(f"note: {args.init} has no weight for the k-best feature(s) "
                 f"{', '.join(added)}: they start at {init_weights[added[0]][0]:g} (half the "
                 "language model's weight)")
    if init_weights is not None:
        init = pool.weight_vector(init_weights, args.init)
    else:
        init = np.zeros(pool.dim)
    starts = [pool.weight_vector(read_weights(p), p) for p in args.start]
    log = None if args.quiet else _err
    t1 = time.time()
    res = optimise_pool(pool.arrays(), args.algorithm, init, starts, settings,
                        progress=not args.quiet, log=log)
    t2 = time.time()
    out = pool.weights_dict(res.weights, init_weights)
    write_weights(args.out, out)
    arrays = pool.arrays()
    from nlmfeature.mt.tuning.mert import LineSearcher

    searcher = LineSearcher(arrays)
    best_rows = searcher.one_best(res.weights)
    summary = bleu_summary(searcher.stats64[best_rows].sum(axis=0))
    print(f"{args.algorithm}: {len(args.nbest)} list(s), {pool.num_sentences} sentences, "
          f"{pool.num_hypotheses} distinct hypotheses, {pool.dim} weights")
    print(f"BLEU (re-ranked 1-best) before {res.initial_bleu:.2f} after {res.bleu:.2f}")
    print(f"after: {summary}")
    print(f"time: reading {t1 - t0:.1f}s, optimising {t2 - t1:.1f}s; weights written to {args.out}")
    if args.output_1best:
        from nlmfeature.io.atomicfile import open_output

        with open_output(args.output_1best) as f:
            for text in pool.texts(best_rows):
                f.write(text + "\n")
    return 0


# -- decoder in the loop --------------------------------------------------------------------
def _driver_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", required=True, help="dev set source text the decoder translates")
    p.add_argument("--workdir", required=True,
                   help="work directory; rerunning the same command resumes from it")
    p.add_argument("--nbest-size", type=Number(int, 1, MAX_INT), default=100,
                   help="k-best list size per iteration (default: 100)")
    p.add_argument("--distinct", action="store_true",
                   help="ask the decoder for distinct k-best strings (Moses 'distinct', cdec -r)")
    p.add_argument("--max-iterations", type=Number(int, 1, MAX_INT), default=25,
                   help="stop after this many decoding iterations (default: 25); a tuning "
                        "this limit stopped, run again with a higher one, tunes on from where it "
                        "stopped (a converged one is left as it is)")
    p.add_argument("--min-change", type=Number(float, 0), default=1e-5,
                   help="stop when no L1-normalised weight changes by this much (default: 1e-5)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help=f"decoder threads (Moses -threads; default: {DEFAULT_THREADS})")
    p.add_argument("--persistent-cache", metavar="DIR",
                   help="add persistent-cache=DIR to the NLM feature lines of the config, so "
                        "later iterations reuse n-gram scores cached by earlier ones")
    p.add_argument("--persistent-cache-max", metavar="SIZE", type=size_bytes,
                   help="with --persistent-cache: its disk bound (500M, 2G, ...; default: the "
                        "feature's own, 4G).  At the bound the first dev sentences keep their files "
                        "and the others get none: a Multi30k sentence takes ~2 MB after one "
                        "iteration and ~4 MB after four with a class model")
    p.add_argument("--nlm-feature", action="append", default=None, metavar="NAME",
                   help="feature whose config line gets the persistent cache option: a Moses "
                        "[feature] class or a cdec feature_function name / library file name "
                        "(repeatable; default: NLMFeature for Moses, libcdec_ff_nlm.so for cdec)")
    p.add_argument("--cache-key", default="persistent-cache",
                   help="option name of the persistent cache on the feature line, written as "
                        "key=DIR for Moses and --key DIR for cdec (default: persistent-cache)")
    p.add_argument("--final-weights", choices=FINAL_WEIGHTS, default=FINAL_WEIGHTS_DEFAULT,
                   help="weights of the tuned config: 'last' (the last optimiser output, as "
                        "mert-moses.pl) or 'best' (those whose decode scored the best dev BLEU, "
                        "mert-moses.pl --return-best-dev); both are written as "
                        "weights.last.txt / weights.best.txt (default: %(default)s; on Multi30k "
                        "'best' scored 0.25 test BLEU less, README 'bench mt')")
    p.add_argument("--decoder-arg", action="append", default=[], metavar="ARG",
                   help="extra argument passed to the decoder (repeatable)")
    _add_bleu_options(p)
    _add_optimiser_options(p)


def cmd_driver(args: argparse.Namespace) -> int:
    from nlmfeature.mt.tuning.driver import Driver, DriverSettings

    settings = _optimiser_settings(args)

    binary = args.moses if args.decoder == "moses" else args.cdec
    settings = DriverSettings(
        decoder=args.decoder, binary=binary, config=args.config, source=args.source,
        refs=args.ref, workdir=args.workdir, weights=getattr(args, "weights", None),
        nbest_size=args.nbest_size, distinct=args.distinct, max_iterations=args.max_iterations,
        algorithm=args.algorithm, threads=args.threads, persistent_cache=args.persistent_cache,
        persistent_cache_max=args.persistent_cache_max, nlm_features=args.nlm_feature,
        cache_key=args.cache_key,
        tokenize=args.tokenize, lowercase=args.lowercase, min_change=args.min_change,
        decoder_args=args.decoder_arg, optimiser=settings,
        final_weights=args.final_weights)
    state = Driver(settings, log=_err, progress=not args.quiet).run()
    best = max(state.history, key=lambda h: h.get("dev_bleu", -1))
    print(f"finished after {len(state.history)} iteration(s): {state.stop_reason}")
    for h in state.history:
        print(f"  iteration {h['iteration']}: dev BLEU {h.get('dev_bleu', float('nan')):.2f}, "
              f"pool BLEU {h.get('pool_bleu_before', float('nan')):.2f} -> "
              f"{h.get('pool_bleu_after', float('nan')):.2f}")
    print(f"best decoder dev BLEU {best.get('dev_bleu', float('nan')):.2f} at iteration "
          f"{best['iteration']}; log in {args.workdir}/log.tsv")
    return 0


# -- bleu -----------------------------------------------------------------------------------
def cmd_bleu(args: argparse.Namespace) -> int:
    refs = References.from_files(args.ref, tokenize=args.tokenize, lowercase=args.lowercase)
    if args.kbest:
        from nlmfeature.mt.kbest import first_hypotheses

        hyps = first_hypotheses(args.input, len(refs))
    else:
        from nlmfeature.io.textio import read_lines

        hyps = read_lines(args.input, stream=True)
    if len(hyps) != len(refs):
        raise NLMFeatureError(f"{args.input}: {len(hyps)} sentences but the references have "
                              f"{len(refs)}")
    print(bleu_summary(refs.corpus_stats(hyps).sum(axis=0)))
    return 0


def build_parser(outer: Optional[argparse._SubParsersAction] = None) -> argparse.ArgumentParser:
    """The argument parser of ``nlmfeature-tune``, or with ``outer`` the ``tune`` subcommand of
    ``nlmfeature`` (the same subcommands and flags)."""
    description = "Tune decoder feature weights on k-best lists: MERT, batch MIRA, PRO."
    if outer is None:
        parser = argparse.ArgumentParser(prog="nlmfeature-tune", description=description)
    else:
        parser = outer.add_parser("tune", help="tune decoder weights (MERT, MIRA, PRO) on k-best "
                                               "lists or with Moses / cdec in the loop",
                                  description=description)
    parser.set_defaults(interrupt_hint="rerun the same command to resume a driver run")
    sub = parser.add_subparsers(dest="tune_command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("optimise", aliases=["optimize"],
                       help="tune weights on accumulated k-best lists: MERT (Och's line search, "
                            "restarts), batch MIRA (as kbmira) or PRO",
                       description="Optimise weights over accumulated k-best lists (merged, "
                                   "duplicates removed) and write them as 'Name= v ...' lines.")
    p.add_argument("--nbest", action="append", required=True, metavar="KBEST",
                   help="k-best list (Moses or cdec format, .gz ok); repeat to merge lists of "
                        "several iterations")
    p.add_argument("--init", metavar="WEIGHTS",
                   help="initial weights: moses.ini or 'Name= v ...' file (required for mert "
                        "and mira); labels not in the k-best lists are copied to the output")
    p.add_argument("--start", action="append", default=[], metavar="WEIGHTS",
                   help="MERT: a further starting point, e.g. the previous iteration's best "
                        "(repeatable)")
    p.add_argument("-o", "--output", "--out", dest="out", required=True, metavar="WEIGHTS_OUT",
                   help="where to write the tuned weights (L1-normalised)")
    p.add_argument("--format", default="auto", choices=("auto", "moses", "moses-old", "cdec"),
                   help="k-best format (default: auto, detected from the first line)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip malformed k-best lines instead of stopping at the first")
    p.add_argument("--save-pool", metavar="NPZ",
                   help="also save the merged pool (features + BLEU statistics) as .npz")
    p.add_argument("--one-best", "--output-1best", dest="output_1best", metavar="FILE",
                   help="write the re-ranked 1-best hypotheses under the tuned weights")
    _add_bleu_options(p)
    _add_optimiser_options(p)
    p.set_defaults(func=cmd_optimise)

    p = sub.add_parser("moses", help="tune a Moses config with the decoder in the loop, like "
                                    "mert-moses.pl: resumable, --persistent-cache for the NLM",
                       description="Decode the dev set with Moses, merge k-best lists, "
                                   "optimise, repeat (like mert-moses.pl); resumable.")
    p.add_argument("--moses", required=True, metavar="BIN", help="Moses executable (moses-cmd)")
    p.add_argument("--config", required=True, help="moses.ini to tune (a copy is rewritten)")
    _driver_common(p)
    p.set_defaults(func=cmd_driver, decoder="moses")

    p = sub.add_parser("cdec", help="tune a cdec config with the decoder in the loop: "
                                   "resumable, --persistent-cache for the NLM",
                       description="Decode the dev set with cdec, merge k-best lists, optimise, "
                                   "repeat; resumable.")
    p.add_argument("--cdec", required=True, metavar="BIN", help="cdec executable")
    p.add_argument("--config", required=True, help="cdec.ini")
    p.add_argument("--weights", required=True, help="initial cdec weights file ('name value')")
    _driver_common(p)
    p.set_defaults(func=cmd_driver, decoder="cdec")

    p = sub.add_parser("bleu", help="corpus BLEU of text or a k-best list's first hypotheses",
                       description="Corpus BLEU from sufficient statistics (equals sacrebleu "
                                   "with the same tokeniser).")
    p.add_argument("input", help="hypothesis text (one line per sentence) or k-best list")
    p.add_argument("--kbest", action="store_true",
                   help="input is a k-best list: score each sentence's first hypothesis")
    _add_bleu_options(p)
    p.set_defaults(func=cmd_bleu)
    return parser


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``tune`` to the ``nlmfeature`` subcommands."""
    build_parser(sub)


def main(argv: Optional[List[str]] = None) -> int:
    """``nlmfeature-tune``: the command on its own (also called from Python)."""
    return standalone(build_parser, argv)
