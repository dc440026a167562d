"""``nlmfeature bench``: benchmarks that print figures (query speed, training speed, BLEU in a
decoder, memory against quality, training at scale) and the system they run on.  The flags of each benchmark are here;
the work is its module's in :mod:`nlmfeature.bench`."""
from __future__ import annotations

import argparse

from nlmfeature.bench import memory as bench_memory
from nlmfeature.bench import mt as bench_mt
from nlmfeature.bench import query as bench_query
from nlmfeature.bench import scale as bench_scale
from nlmfeature.bench import shared_data
from nlmfeature.bench import systems as bench_systems
from nlmfeature.bench import train as bench_train
from nlmfeature.commands import DEFAULT_THREADS


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``bench`` and its benchmarks to the ``nlmfeature`` subcommands."""
    p = sub.add_parser("bench", help="benchmarks (query speed, training speed, memory against quality)",
                       description="Benchmarks on the shared real data; they print tables "
                                   "(or JSON with --json).")
    bench_sub = p.add_subparsers(dest="bench", metavar="BENCHMARK")
    bench_sub.required = True
    for add in (_query, _train, _mt, _memory, _scale, _system):
        add(bench_sub)


def _query(bench_sub: argparse._SubParsersAction) -> None:
    """``nlmfeature bench query``: the flags; the work is :mod:`nlmfeature.bench.query`'s."""
    p = bench_sub.add_parser("query", help="native lookup speed of each model x output layer",
                             description=bench_query.__doc__)
    p.add_argument("--data", default=bench_query.DEFAULT_DATA,
                   help="the shared data folder (default: ../shared/data beside the repository)")
    p.add_argument("--text", default="test", choices=["train", "valid", "test"],
                   help="Brown split whose n-grams are streamed (default test)")
    p.add_argument("--order", type=int, default=5, help="n-gram order of the models (default 5)")
    p.add_argument("--min-count", type=int, default=1,
                   help="vocabulary: training words seen at least this often (default 1: all)")
    p.add_argument("--max-vocab", type=int, default=None, help="cap the vocabulary size")
    p.add_argument("--classes", type=int, default=0, help="classes of class-factored models "
                   "(default round(sqrt(V)))")
    p.add_argument("--models", default="", help=f"comma-separated subset of {','.join(bench_query.MODELS)}")
    p.add_argument("--outputs", default="", help=f"comma-separated subset of {','.join(bench_query.OUTPUTS)}")
    p.add_argument("--seconds", type=float, default=2.0,
                   help="minimum timing per measurement, after one untimed warm-up pass (default 2)")
    p.add_argument("--cache-entries", type=int, default=bench_query.DEFAULT_CACHE_ENTRIES,
                   help="per-sentence cache bound per session; 0 disables caching (default "
                        f"{bench_query.DEFAULT_CACHE_ENTRIES}, the library's NLM_DEFAULT_CACHE_ENTRIES)")
    p.add_argument("--max-lookups", type=int, default=2000,
                   help="softmax rows only: stream prefix length (exact softmax is slow; default 2000)")
    p.add_argument("--decoder-stream", default="moses",
                   help="the decoder-like stream for the cache figures: 'moses' (default: the bundled "
                        "real Moses query log, nlmfeature/data/streams), 'nbest' (the n-grams of a real Moses "
                        "100-best list), a .qlog.xz file (nlmfeature querylog pack), or 'none'")
    p.add_argument("--stream-sentences", type=int, default=0,
                   help="replay only the first N sentences of the query log (default all)")
    p.add_argument("--nbest-lines", type=int, default=20000,
                   help="with --decoder-stream nbest: hypotheses of the 100-best list used")
    p.add_argument("--workdir", default="", help="where model files are written (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the model files")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=bench_query.run)


def _train(bench_sub: argparse._SubParsersAction) -> None:
    """``nlmfeature bench train``: the flags; the work is :mod:`nlmfeature.bench.train`'s."""
    p = bench_sub.add_parser("train", help="training speed and perplexity on Brown (vs KenLM)",
                             description="Train each configuration on Brown train (valid picks the best "
                                         "epoch) and report training words/s with 1 and 2 threads, "
                                         "epochs to best, valid/test perplexity, the KenLM 5-gram test "
                                         "perplexity, the interpolated perplexity and the model size, "
                                         "against the targets (neural <= 0.85 x KenLM, interpolated "
                                         "<= 0.80 x, class NCE >= 50k words/s).",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=bench_train.DEFAULT_DATA,
                   help="folder with train.txt.gz, valid.txt.gz, test.txt.gz (default: the shared Brown corpus)")
    p.add_argument("-o", "--output", "--out", dest="out", default=None,
                   help="output folder for the models and logs (default: a temporary folder, removed afterwards)")
    p.add_argument("--configs", default=",".join(bench_train.CONFIGS),
                   help=f"comma-separated configurations to run (default all: {', '.join(bench_train.CONFIGS)})")
    p.add_argument("--iterations", type=int, default=6, help="at most this many epochs per configuration (default 6)")
    p.add_argument("--patience", type=int, default=4,
                   help=f"stop a configuration after this many held-out evaluations without improvement "
                        f"({bench_train.EVALS_PER_EPOCH} per epoch; default 4)")
    p.add_argument("--minutes", type=float, default=5.0,
                   help="time cap of each configuration's training (default 5)")
    p.add_argument("--speed-updates", type=int, default=300,
                   help="timed minibatches of each 1-/2-thread speed run (default 300, after 20 untimed)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help=f"threads of the main training runs (default {DEFAULT_THREADS}; the speed runs always measure 1 and 2)")
    p.add_argument("--lambda-lbl", type=float, default=None, help="override the L2 strength of every configuration")
    p.add_argument("--quick", action="store_true",
                   help="small models on slices (5k training sentences, 2 epochs): checks the benchmark runs")
    p.add_argument("--no-kenlm", dest="kenlm", action="store_false",
                   help="skip the KenLM baseline and interpolation")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=bench_train.run)


def _mt(bench_sub: argparse._SubParsersAction) -> None:
    """``nlmfeature bench mt``: the flags; the work is :mod:`nlmfeature.bench.mt`'s."""
    from nlmfeature.mt.tuning.driver import FINAL_WEIGHTS, FINAL_WEIGHTS_DEFAULT

    p = bench_sub.add_parser("mt", help="BLEU with and without NLMs in a real Moses (and cdec) "
                                        "system",
                             description=bench_mt.__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", default=shared_data("moses", "multi30k-de-en"),
                   help="Moses system folder: moses.{tuned,untuned}.ini with MODEL_DIR/ paths, "
                        "tables, ARPA LM, train.tok.lc.en.gz (default: " + bench_mt.DEFAULT_SYSTEM +
                        " beside the repository)")
    p.add_argument("--data", default=shared_data("parallel", "multi30k"),
                   help="raw parallel text: NAME.LANG.gz per set (default: " + bench_mt.DEFAULT_DATA +
                        " beside the repository)")
    p.add_argument("--src-lang", default="de", help="source language (default de)")
    p.add_argument("--tgt-lang", default="en", help="target language (default en)")
    p.add_argument("--dev", default="dev", help="tuning set name (default dev)")
    p.add_argument("--test", action="append", default=None,
                   help="test set name, repeatable (default test: Multi30k test2016); no "
                        "choice is made on it")
    p.add_argument("--decoder", default="moses", choices=("moses", "moses2", "cdec", "both"),
                   help="which decoder's system is tuned and decoded with and without the NLM: "
                        "Moses' phrase-based system (and the k-best rescoring part, which "
                        "reranks Moses' lists), the same system in Moses2 (moses2: the Moses "
                        "part run with the moses2 executable, --moses or $MOSES_ROOT's; the "
                        "tuning loop is the same), cdec's hiero system made from the same training "
                        "pairs, alignment and LM (labelled cdec in every output; KenLM and "
                        "KenLM + NLM only, no --joint), or both (default moses)")
    p.add_argument("--search", default="normal", choices=("normal", "cube"),
                   help="the Moses / Moses2 search of every side: normal (the system's own, stack "
                        "decoding: every expansion scored) or cube (cube pruning, [search-algorithm] 1 "
                        "at the decoder's default pop limit: far fewer expansions scored, the search "
                        "Moses2 is optimised for); tunings, decodes and k-best lists of each search "
                        "are kept apart in the workdir (default normal)")
    p.add_argument("--moses", default=None,
                   help="Moses (or, with --decoder moses2, Moses2) executable built with NLMFeature "
                        "(default $MOSES_ROOT/bin/moses, else "
                        "the newest moses-cmd build under $MOSES_ROOT)")
    p.add_argument("--cdec-root", default=None,
                   help="a built cdec tree for --decoder cdec/both: its build/decoder/cdec and "
                        "build/extractor/run_extractor (default $CDEC_ROOT)")
    p.add_argument("--cdec", default=None,
                   help="the cdec executable, if not the --cdec-root one")
    p.add_argument("--cdec-ff", default=None, metavar="LIB",
                   help="nlmfeature's cdec feature library (default cdec_ff/libcdec_ff_nlm.so "
                        "of this repository: make -C cdec_ff CDEC_ROOT=..., cdec_ff/README.md)")
    p.add_argument("--model", "-m", action="append", default=[],
                   help="NLM model file; repeat for several NLM features in one system "
                        "(default: train one with --recipe)")
    p.add_argument("--joint", action="append", default=[], metavar="MODEL",
                   help="a joint model (nlmfeature train --source, docs/joint.md); repeat for "
                        "several: adds a third system, KenLM + NLM + joint, tuned --tunings "
                        "times beside the other two and compared with both.  Decoding: one "
                        "NLMJointFeature line per model (NNJM0, NNJM1, ...; weights start at "
                        "half the LM's).  Rescoring: the 1000-best lists carry Moses' word "
                        "alignments (-print-alignment-info-in-n-best), each joint model adds "
                        "one feature NNJMi (given the dev / test source) to the NLM side's "
                        "features.  An inverse model (train --target-to-source, log p(source | "
                        "hypothesis)) is a rescoring feature only: in the rescoring part, and "
                        "with --second-pass on the decoder's k-best lists, never in the "
                        "decoder (refused with the decoding part and no --second-pass). "
                        "Default: none")
    p.add_argument("--nlm-alone", action="store_true",
                   help="also a system with the NLM(s) as its only language model: the KenLM "
                        "feature lines and weights removed from the KenLM + NLM system, tuned "
                        "--tunings times beside the others and compared with KenLM only (the "
                        "Moses decoding part; Baltescu and Blunsom 2015's comparison)")
    p.add_argument("--rescore-model", action="append", default=[], metavar="MODEL",
                   help="a target-only NLM used only in the rescoring part, beside the --model "
                        "ones (features NLM<n>, NLM<n+1>, ... after theirs): e.g. a "
                        "right-to-left model (train --reverse), which a left-to-right decoder "
                        "cannot use; repeatable. Default: none")
    p.add_argument("--second-pass", action="store_true",
                   help="decode, then rescore: every KenLM + NLM tuning of the Moses decoding "
                        "part writes --kbest lists of dev and test with word alignments, the "
                        "--rescore-model NLMs are appended and the weights tuned on dev (MERT, "
                        "the tuning's seed); with --joint, every KenLM + NLM + joint tuning "
                        "(or, with only inverse joint models, every KenLM + NLM tuning) the "
                        "same with the --rescore-model NLMs and the inverse joint models "
                        "appended; reported against KenLM-only decoding and each other as the "
                        "part 'decoding + rescoring' (the best translations the package gives: "
                        "left-to-right NLM and joint model in the search, right-to-left and "
                        "inverse models on its k-best).  Needs --rescore-model or an inverse "
                        "--joint model")
    p.add_argument("--rescore-restarts", type=int, default=20,
                   help="MERT random restarts of each rescoring tuning (default 20, as "
                        "mert-moses.pl)")
    p.add_argument("--recipe", action="append", default=None, metavar="OPTIONS",
                   help="nlmfeature train options of a model to train when no --model is "
                        "given; repeated: one model each, their ensemble (nlmfeature "
                        "ensemble) is the feature.  Default: '%s' and '%s', i.e. the order-8 "
                        "LBL of nlmfeature train's defaults and the same by self-normalised "
                        "maximum likelihood, as one ensemble: the feature of README's bench mt "
                        "figures (+1.66 BLEU in Moses decoding)" % bench_mt.DEFAULT_RECIPES)
    p.add_argument("--init", default="tuned", choices=("tuned", "untuned"),
                   help="starting weights of the Moses part: the system's moses.tuned.ini "
                        "(KenLM-only MERT weights; the NLM weight starts at half the LM's) or "
                        "moses.untuned.ini (default tuned); the cdec part starts from hand-set "
                        "weights (nlmfeature.mt.cdec.BASE_WEIGHTS)")
    p.add_argument("--tunings", type=int, default=3,
                   help="tuning runs per system, seeds 1..N (default 3)")
    p.add_argument("--algorithm", default="mert", choices=("mert", "mira"),
                   help="optimiser of nlmfeature-tune (default mert)")
    p.add_argument("--max-iterations", type=int, default=None,
                   help="decoding iterations per tuning at most (default 10; 6 with --quick); "
                        "raised on a workdir, the tunings the lower limit stopped tune on")
    p.add_argument("--nbest-size", type=int, default=100, help="k-best size while tuning (100)")
    p.add_argument("--final-weights", choices=FINAL_WEIGHTS, default=FINAL_WEIGHTS_DEFAULT,
                   help="which weights of a tuning the headline scores use (both are always "
                        "measured; default %(default)s, nlmfeature-tune's default)")
    p.add_argument("--kbest", type=int, default=1000,
                   help="k-best size of the rescoring lists (default 1000)")
    p.add_argument("--distinct", action="store_true",
                   help="distinct k-best strings for rescoring (Moses 'distinct': tens of "
                        "times slower for 1000-best lists than without)")
    p.add_argument("--quick", action="store_true",
                   help="tune on the first --quick-sentences dev sentences (labelled QUICK)")
    p.add_argument("--quick-sentences", type=int, default=300, help="(default 300)")
    p.add_argument("--test-sentences", type=int, default=0,
                   help="translate only the first N sentences of each test set (default 0: "
                        "all; for smoke tests, labelled)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help=f"Moses threads (default {DEFAULT_THREADS}; cdec decodes on one)")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes of the optimiser and the rescorer (default 1)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (1000)")
    p.add_argument("--no-decoding", action="store_true",
                   help="skip the decoder-in-the-loop parts (Moses' and cdec's)")
    p.add_argument("--no-rescoring", action="store_true", help="skip the k-best rescoring part")
    p.add_argument("--workdir", default="nlmfeature-bench-mt",
                   help="work directory; rerunning reuses finished steps (default "
                        "./nlmfeature-bench-mt)")
    p.add_argument("--plot", default=None, help="PNG plot path (default WORKDIR/bench-mt.png)")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of tables")
    p.add_argument("--markdown", action="store_true",
                   help="print the scores as one markdown table instead (the tables of README "
                        "and docs/joint.md)")
    p.set_defaults(func=bench_mt.run, test=None)


def _memory(bench_sub: argparse._SubParsersAction) -> None:
    """``nlmfeature bench memory``: the flags; the work is :mod:`nlmfeature.bench.memory`'s."""
    p = bench_sub.add_parser("memory", help="perplexity, BLEU and the decoder's memory against model size (widths, "
                                            "float16, pruned direct features; KenLM probing/trie/quantised/pruned)",
                             description=bench_memory.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", default=bench_memory.DEFAULT_TRAIN,
                   help="training text (default: the English side of the shared Multi30k system)")
    p.add_argument("--valid", default=bench_memory.DEFAULT_VALID, help="held-out text for early stopping and "
                                                          "interpolation weights (default: Multi30k dev)")
    p.add_argument("--test", default=bench_memory.DEFAULT_TEST, help="test text (default: Multi30k test2016)")
    p.add_argument("--widths", default="50,100,200",
                   help="embedding widths of the neural models without direct features (default 50,100,200)")
    p.add_argument("--direct-hash-spaces", default="4194304,524288",
                   help="hashed-store sizes of the width-200 models with direct features of orders 1-3 "
                        "(default 4194304,524288: the train default and a store pruned 8x)")
    p.add_argument("-m", "--model", action="append", default=[], metavar="MODEL",
                   help="a model file of your own (e.g. trained on a large corpus), measured as it is "
                        "beside the trained ones, with its float16 copy; repeatable.  All rows share one "
                        "vocabulary: with models of your own, --widths '' --direct-hash-spaces '' "
                        "trains none (--quick then trains none either).  Default: none")
    p.add_argument("--iterations", type=int, default=20, help="epochs at most per model (default 20)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help=f"training threads (default {DEFAULT_THREADS})")
    p.add_argument("-o", "--output", "--out", dest="out", default=None,
                   help="output folder for the models (default: a temporary folder, removed afterwards)")
    p.add_argument("--plot", metavar="PNG", default=None,
                   help="also draw perplexity against size into this PNG (needs matplotlib: "
                        "pip install 'nlmfeature[plot]')")
    p.add_argument("--quick", action="store_true",
                   help="tiny models for one epoch on the first 2000 training sentences: checks the "
                        "benchmark runs, the figures mean nothing")
    p.add_argument("--no-bleu", action="store_true",
                   help="skip BLEU against size (the k-best rescoring with each model as the only LM and "
                        "beside the lists' LM)")
    p.add_argument("--nbest-dir", default=bench_memory._SHARED,
                   help="real Moses k-best lists for BLEU: DEV_NBEST, test.tuned.100best.gz, "
                        "dev.ref.en.gz, test.ref.en.gz and moses.tuned.ini (default: "
                        "../shared/data/nbest/moses-multi30k-de-en; `nlmfeature bench system` "
                        "writes them for its system into OUT/nbest)")
    p.add_argument("--dev-nbest", default=None,
                   help="the dev k-best list in --nbest-dir that weights are tuned on (default: "
                        "the last MERT iteration's, the highest dev.iterN.100best.gz there)")
    p.add_argument("--tunings", type=int, default=3,
                   help="MERT runs (seeds 1..N) per model for BLEU (default 3)")
    p.add_argument("--jobs", type=int, default=2, help="processes for MERT's restarts (default 2)")
    p.add_argument("--moses", metavar="EXE", default=None,
                   help="also measure each model as the language model of this decoder (Moses or Moses2 "
                        "with NLMFeature): its peak memory and load time (needs --decoder-config and "
                        "--decoder-input; default: not measured)")
    p.add_argument("--decoder-config", metavar="INI", default=None,
                   help="the decoder's moses.ini for --moses, with one KENLM feature: each model replaces "
                        "it under the same label and weight (e.g. a tuned config of `bench mt`'s workdir, "
                        "whose tables are filtered to the test set)")
    p.add_argument("--decoder-input", metavar="FILE", default=None,
                   help="source sentences the decoder translates for --moses (e.g. the test set's source "
                        "side)")
    p.add_argument("--decoder-sentences", type=int, default=100, metavar="N",
                   help="translate the first N lines of --decoder-input (default 100)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--markdown", action="store_true",
                   help="print the results as one markdown table (the table of docs/training.md)")
    p.set_defaults(func=bench_memory.run)


def _scale(bench_sub: argparse._SubParsersAction) -> None:
    """``nlmfeature bench scale``: the flags; the work is :mod:`nlmfeature.bench.scale`'s."""
    p = bench_sub.add_parser("scale", help="training at corpus scale: memory, words/s, perplexity vs KenLM",
                             description=bench_scale.__doc__.split("\n\n")[0].split(": ", 1)[1],
                             epilog="Example (the Gutenberg corpus of 'nlmfeature corpus gutenberg'):\n"
                                    "  nlmfeature bench scale --train gb/train.txt --valid gb/valid.txt "
                                    "--test gb/test.txt --workdir scale --markdown --png scale.png",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True, metavar="TEXT", help="tokenised training text")
    p.add_argument("--valid", required=True, metavar="TEXT", help="held-out text for early stopping and tuning")
    p.add_argument("--test", required=True, metavar="TEXT", help="test text (never trained on)")
    p.add_argument("--workdir", required=True, metavar="DIR", help="where corpora and models are written")
    p.add_argument("--sizes", default="10M,50M,all", metavar="LIST",
                   help="corpus sizes in tokens (K/M/B suffixes; 'all' is the whole text; a smaller size "
                        "takes whole lines from 100 stretches across the text); default 10M,50M,all")
    p.add_argument("--repeat", default="4", metavar="LIST",
                   help="also measure memory on the largest corpus repeated this many times "
                        "(comma-separated; default 4; e.g. 32 for about 1B tokens from 30M)")
    p.add_argument("--threads", default="1,2", metavar="LIST", help="thread counts to time (default 1,2)")
    p.add_argument("--engines", default="native,torch", metavar="LIST",
                   help="training engines the speed part times (default native,torch; torch only when "
                        "it is installed, on the GPU when there is one); the others keep the speed rows "
                        "of the earlier run in --workdir")
    p.add_argument("--max-vocab", type=int, default=100000, metavar="V",
                   help="vocabulary size of every model (default 100000)")
    p.add_argument("--hash-space", type=int, default=1 << 22, metavar="H",
                   help="direct-feature hash space of the memory runs (fixed so only the corpus "
                        "changes; default 4194304)")
    p.add_argument("--memory-updates", type=int, default=200, metavar="N",
                   help="minibatches of each memory run, with a held-out evaluation at half and at "
                        "the end on --test-tokens/2 tokens of --valid (default 200)")
    p.add_argument("--speed-updates", type=int, default=400, metavar="N",
                   help="timed minibatches of each speed run (default 400)")
    p.add_argument("--train-minutes", type=float, default=30.0, metavar="M",
                   help="training time of the quality model (default 30; 0 skips the quality part)")
    p.add_argument("--quality-sizes", default="", metavar="LIST",
                   help="also train the quality recipe and KenLM on these smaller --sizes (e.g. 10M,50M) "
                        "and compare them on the same test text: perplexity against corpus size "
                        "(default none)")
    p.add_argument("--quality-size-minutes", type=float, default=0.0, metavar="M",
                   help="training time of each --quality-sizes model (default: --train-minutes)")
    p.add_argument("--test-tokens", type=int, default=20000, metavar="N",
                   help="test tokens scored (exact normalisation costs a pass over the vocabulary "
                        "per token; default 20000)")
    p.add_argument("--kenlm-order", type=int, default=5, metavar="N", help="KenLM order (default 5)")
    p.add_argument("--order", type=int, default=None, metavar="N", help="NLM order (default: train's)")
    p.add_argument("--train-flags", default="", metavar="FLAGS",
                   help="more 'nlmfeature train' flags for the quality model, as one quoted string "
                        "(e.g. '--lr-decay 0.5 --patience 2'; default none: train's defaults).  The "
                        "workdir keeps the quality model of the last options only: other flags, "
                        "--order, --max-vocab, --threads or --train-minutes train a new one")
    p.add_argument("--parts", default="corpus,speed,quality,memory", metavar="LIST",
                   help="what to measure (default corpus,speed,quality,memory; 'curve': the "
                        "--quality-sizes models alone, beside an earlier quality part's); a run of some parts "
                        "reuses the workdir's corpora and keeps the other parts' figures from its "
                        "earlier bench-scale.json, e.g. --parts speed to time again on an idle machine; "
                        "'none' measures nothing and writes the earlier run's tables (--results, --png)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--markdown", action="store_true", help="print markdown tables (the default without --json)")
    p.add_argument("--png", metavar="FILE", help="plot memory and perplexity against corpus size")
    p.add_argument("--results", metavar="MD",
                   help="write the tables, with this command, the date, commit and machine, into this "
                        "markdown file between its bench-scale markers (appended when it has none), "
                        "e.g. docs/results.md")
    p.set_defaults(func=bench_scale.run)


def _system(bench_sub: argparse._SubParsersAction) -> None:
    """``bench system``: build a realistic-size Moses system (:mod:`nlmfeature.bench.systems`)."""
    p = bench_sub.add_parser("system", help="build a realistic-size Moses system from fetched mirrors",
                             description=bench_systems.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=("tatoeba",),
                   help="the system: tatoeba (Tatoeba German-English, newstest2013/2014)")
    p.add_argument("--output", "-o", required=True, help="output folder: the system is built (and written) there")
    p.add_argument("--mirrors", default=None,
                   help="folder of fetched GitHub mirrors, OWNER+NAME/repo each (default "
                        "$NLMFEATURE_MIRRORS, else " + bench_systems.DEFAULT_MIRRORS + " beside the repository)")
    p.add_argument("--heldout", default=shared_data("heldout", "tatoeba.sha256"),
                   help="held-out list: SHA-256 keys of sentences kept out of training (default "
                        "../shared/data/heldout/tatoeba.sha256 beside the repository)")
    p.add_argument("--moses-root", default=None,
                   help="a built Moses tree: scripts/training/train-model.perl, bin/extract, "
                        "bin/score, bin/moses, bin/lmplz (default $MOSES_ROOT)")
    p.add_argument("--moses", default=None, help="the Moses executable, if not MOSES_ROOT/bin/moses")
    p.add_argument("--fast-align", default=None, metavar="DIR",
                   help="a folder with fast_align and atools built (default: build them from the "
                        "github:clab/fast_align mirror into OUT/tools)")
    p.add_argument("--steps", default=None,
                   help="comma-separated steps to run, of " + ",".join(bench_systems.STEPS) + " (default all; "
                        "the big-* ones only with --big-lm-text)")
    p.add_argument("--seed", type=int, default=1, help="seed of the split and of MERT (default 1)")
    p.add_argument("--dev-size", type=int, default=1000, help="dev pairs (default 1000)")
    p.add_argument("--test-size", type=int, default=1000, help="test pairs (default 1000)")
    p.add_argument("--limit", type=int, default=0,
                   help="use only the first N pairs of the export (for smoke tests; default all)")
    p.add_argument("--no-newstest", action="store_true",
                   help="leave out newstest2013/2014 (no OPUS-MT-testsets mirror needed)")
    p.add_argument("--eval-sets", default=None,
                   help="comma-separated sets decoded after tuning (default: dev, test and the "
                        "newstest sets)")
    p.add_argument("--max-iterations", type=int, default=10,
                   help="MERT decoding iterations at most (default 10)")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help="threads of train-model.perl, the fast_align build and Moses (default %(default)s)")
    p.add_argument("--lm-memory", default="1G", help="lmplz -S for the small LM (default 1G)")
    p.add_argument("--big-lm-text", action="append", default=[], metavar="FILE",
                   help="tokenised lowercased English text of the big LM (repeatable; the "
                        "English training side is added); makes OUT/big, and OUT/big-small with "
                        "both LMs as two features")
    p.add_argument("--big-start", choices=("untuned", "small-tuned"), default="untuned",
                   help="weights the big-LM system's MERT starts from: Moses' defaults "
                        "(untuned) or the small system's tuned ones (default untuned)")
    p.add_argument("--big-lm-memory", default="40%", help="lmplz -S for the big LM (default 40%%)")
    p.add_argument("--json", action="store_true", help="print the build record as JSON")
    p.set_defaults(func=bench_systems.run)
