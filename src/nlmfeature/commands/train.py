"""``nlmfeature train``: train a neural language model on tokenised text."""
from __future__ import annotations

import argparse
import os
import sys

from nlmfeature.commands.base import MAX_INT, THREADS, Number
from nlmfeature.io.jsonout import dumps_json
from nlmfeature.core.modelfile import MAX_BRANCHES, MAX_LAYERS, MAX_ORDER, MAX_SOURCE_WINDOW
from nlmfeature.errors import NLMFeatureError

#: widest embedding or hidden layer a flag takes
MAX_WIDTH = 1 << 16
#: largest hashed direct-feature store (float32 entries: 4 GiB)
MAX_HASH_SPACE = 1 << 30
#: most NCE noise samples per word
MAX_NOISE_SAMPLES = 1 << 16

EPILOG = """\
estimators:
  --noise-samples K > 0 with --output unnormalised   noise-contrastive estimation (NCE),
                                                      scores self-normalised (log Z ~ 0)
  --noise-samples K > 0 with --output class          class-factored NCE (Baltescu & Blunsom 2015)
  --noise-samples K > 0 with --output softmax        NCE training, exact softmax at test time
  --noise-samples 0 with --output softmax|class|tree maximum likelihood (minibatch AdaGrad)
  --noise-samples 0 --self-normalise A --output unnormalised
                                                      ML + A*log(Z)^2 (Devlin et al. 2014)

threads: --threads N sizes the BLAS pool and the OpenMP team of the native kernels at run
  time (no environment variable needed).

large corpora: the training text is compiled once into a memory-mapped file of word ids
  (--corpus-dir); n-grams are built from it one shuffle window at a time, so memory does not
  grow with the corpus.  Ctrl-C (or SIGTERM) writes a checkpoint and exits 130; kill -9 loses
  at most --checkpoint-minutes of work; the same command continues either.

resuming: a checkpoint MODEL_OUT.ckpt.npz is written at every evaluation, every
  --checkpoint-minutes and on Ctrl-C; running the same command again resumes from it
  (--no-resume starts afresh); a finished run removes it.  The same --seed and --threads
  give the same model, except that the default recipe on more than one thread trains a
  minibatch per thread without locks (Hogwild!), whose result depends on the threads'
  timing: --no-hogwild (or --threads 1) for a run that repeats exactly.

defaults: the recipe measured best for decoding (docs/training.md, "Choosing a recipe"):
  8-gram log-bilinear, diagonal contexts, 200-wide embeddings, NCE with 10 noise samples
  (self-normalised output: one dot product per decoder query), direct n-gram features of
  orders 1-3, minibatch 250, L2 20, 4 held-out evaluations per epoch, early stop after 4
  without improvement.  So:
  nlmfeature train --train train.txt.gz --test-set valid.txt.gz --model-out lm.nlm
  The lowest perplexity (docs/training.md, "Choosing a recipe"; the figures are in
  docs/results.md) comes from a softmax output trained by maximum likelihood, for rescoring and
  perplexity (a decoder would pay a pass over the vocabulary per query; training takes
  several times longer):
  nlmfeature train --train train.txt.gz --test-set valid.txt.gz --model-out ml.nlm --output softmax
  The token-level mixture of the two beats either (nlmfeature perplexity -m ml.nlm -m lm.nlm).
  For k-best rescoring the best measured (Multi30k 1000-best, beside a right-to-left model)
  is maximum likelihood with self-normalisation, whose raw scores are close to
  log-probabilities, so a decoder can use it too:
  nlmfeature train ... --model-out mlsn.nlm --noise-samples 0 --self-normalise 0.1
  A right-to-left model for k-best rescoring beside it (nlmfeature-rescore -m lm.nlm -m r2l.nlm):
  nlmfeature train --train train.txt.gz --test-set valid.txt.gz --model-out r2l.nlm --reverse

joint model (NNJM), German-English parallel text with its word alignment:
  nlmfeature train --source train.de.gz --train train.en.gz --alignment train.align.gz \\
      --test-source dev.de --test-set dev.en --test-alignment dev.align --model-out joint.nlm \\
      --output class --classes 100 --noise-samples 10 --source-window 7
  its inverse for k-best rescoring beside it (the same files, plus --target-to-source):
  nlmfeature train --source train.de.gz --train train.en.gz --alignment train.align.gz \
      --test-source dev.de --test-set dev.en --test-alignment dev.align --model-out t2s.nlm \
      --target-to-source --order 5 --noise-samples 10

"""


def _layers(text: str):
    try:
        widths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated widths, got {text!r}") from None
    if not widths or any(not 1 <= w <= MAX_WIDTH for w in widths):
        raise argparse.ArgumentTypeError(f"expected comma-separated widths in 1..{MAX_WIDTH}, "
                                         f"got {text!r} (omit the flag for no extra layer)")
    if len(widths) > MAX_LAYERS:
        raise argparse.ArgumentTypeError(f"at most {MAX_LAYERS} extra hidden layers, got {len(widths)}")
    return widths


def register(sub: argparse._SubParsersAction) -> None:
    from nlmfeature.training.trainer import TrainConfig as D   # the defaults live there, once

    p = sub.add_parser("train", help="train a model on tokenised text (NCE, class NCE, ML with "
                                     "AdaGrad; OxLM flag names)",
                       description="Train a feed-forward neural language model on tokenised text "
                                   "(one sentence per line, plain or .gz) and write it in the "
                                   "nlmfeature model format.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("-i", "--input", "--train", "-c", dest="train", required=True, metavar="FILE",
                   help="training text: tokenised, one sentence per line, UTF-8, plain, .gz, .bz2 or "
                        ".xz, of any size; or a compiled corpus (nlmfeature corpus compile). A text is "
                        "compiled into --corpus-dir on first use and the compiled file reused while "
                        "the text is unchanged")
    g.add_argument("--corpus-dir", metavar="DIR", default="",
                   help="where training and held-out texts are compiled (default "
                        "$XDG_CACHE_HOME/nlmfeature/corpora, i.e. ~/.cache/nlmfeature/corpora)")
    g.add_argument("--test-set", metavar="FILE",
                   help="held-out text: its perplexity picks the best model (written when it improves) "
                        "and stops training early (--patience); strongly recommended")
    g.add_argument("-o", "--model-out", required=True, metavar="FILE",
                   help="where to write the model (the output file; --output-layer is the output layer)")
    g.add_argument("--min-count", type=Number(int, 1, MAX_INT), default=D.min_count,
                   help=f"words seen fewer times become <unk> (default {D.min_count}: singletons, as OxLM)")
    g.add_argument("--max-vocab", type=Number(int, 5, MAX_INT), default=None,
                   help="keep at most this many vocabulary entries (specials included), most frequent first")
    g.add_argument("--reverse", action="store_true",
                   help="train a right-to-left model (sentences read backwards; the model file says so "
                        "and nlmfeature-rescore / perplexity reverse hypotheses for it). For k-best "
                        "rescoring beside a left-to-right model, not for decoders")
    g.add_argument("--init-model", metavar="MODEL",
                   help="continue the training of MODEL (a target-only model file) on --train: "
                        "domain adaptation, e.g. a model of a large general corpus trained on "
                        "in-domain text with --test-set in-domain held-out text.  The vocabulary, "
                        "architecture, output layer and direct features are MODEL's (words MODEL "
                        "lacks are <unk>), so the architecture flags are left out; the estimator "
                        "is the one MODEL was trained with unless given; the AdaGrad sums start "
                        "afresh (a smaller --step-size keeps more of MODEL)")
    j = p.add_argument_group("joint models (NNJM: condition on the source sentence)")
    j.add_argument("--source", metavar="FILE",
                   help="source side of the parallel text, line by line with --train (the target "
                        "side): trains a joint model whose words also see --source-window source "
                        "words around their affiliated source word")
    j.add_argument("--alignment", metavar="FILE",
                   help="word alignment of --source/--train, one line per pair, i-j points (source "
                        "position i, target position j, from 0: Moses / fast_align format); "
                        "affiliation as Devlin et al. 2014")
    j.add_argument("--test-source", metavar="FILE", help="source side of the held-out set (--test-set)")
    j.add_argument("--test-alignment", metavar="FILE", help="word alignment of the held-out set")
    j.add_argument("--source-window", type=Number(int, 1, MAX_SOURCE_WINDOW), default=7, metavar="W",
                   help="source words the model sees, 2m+1 centred on the affiliated word "
                        "(default 7, Devlin et al. 2014's window)")
    j.add_argument("--target-to-source", action="store_true",
                   help="train the inverse joint model (Devlin et al. 2014's T2S direction): it "
                        "predicts the --source words, each from its source history and a window "
                        "of --train words around its affiliated target word (same files and "
                        "alignment as the direct model; --test-* likewise). For k-best rescoring "
                        "beside the direct joint model (nlmfeature-rescore scores log p(source | "
                        "hypothesis)); decoders refuse it")
    a = p.add_argument_group("architecture")
    a.add_argument("--arch", choices=["lbl", "nplm", "lateral"], default=D.arch,
                   help=f"log-bilinear (OxLM), NPLM (Vaswani et al.) or lateral branches (default {D.arch})")
    a.add_argument("--order", type=Number(int, 1, MAX_ORDER), default=D.order,
                   help=f"n-gram order n: the model sees n-1 words (default {D.order})")
    a.add_argument("--word-width", type=Number(int, 1, MAX_WIDTH), default=D.word_width,
                   help=f"word embedding dimension E (default {D.word_width})")
    a.add_argument("--hidden", type=Number(int, 0, MAX_WIDTH), default=0,
                   help="first-layer width (nplm/lateral; lbl uses E); 0 = 750 for nplm, 500 for lateral")
    dc = a.add_mutually_exclusive_group()
    dc.add_argument("--diagonal-contexts", dest="diagonal_contexts", action="store_true", default=D.diagonal_contexts,
                    help="lbl: diagonal context matrices (OxLM's --diagonal-contexts; the default)")
    dc.add_argument("--full-contexts", dest="diagonal_contexts", action="store_false",
                    help="lbl: full E x E context matrices (slower to train and query; over-fit on "
                         "Multi30k and Brown)")
    a.add_argument("--activation", default="identity",
                   choices=["identity", "sigmoid", "relu", "tanh", "hardtanh"],
                   help="first-layer activation (default identity for lbl; nplm/lateral switch it to relu)")
    a.add_argument("--hidden-layers", type=_layers, default=[], metavar="W1,W2",
                   help="widths of extra hidden layers, e.g. 150 for NPLM's 150-750-150")
    a.add_argument("--branches", type=Number(int, 1, MAX_BRANCHES), default=1, help="lateral: number of side-by-side first layers")
    a.add_argument("--combine", choices=["none", "max", "add", "mul"], default="none",
                   help="lateral: how branches are combined (default max)")
    a.add_argument("--output-layer", "--output", dest="output", choices=["unnormalised", "softmax", "class", "tree"],
                   default=D.output, help=f"output layer (--output is an older spelling; default {D.output}: NCE-trained self-normalised scores, the fast "
                        "choice for decoders; softmax: exact log-probabilities trained by maximum "
                        "likelihood, the lowest perplexity, for rescoring; class: class-factored with "
                        "--classes or --class-file, exactly normalised)")
    a.add_argument("--classes", type=Number(int, 1, MAX_INT), default=D.classes,
                   help=f"class output: number of frequency-binned classes (default {D.classes})")
    a.add_argument("--class-file", metavar="FILE",
                   help="class output: Brown clusters in wcluster's paths format (bitstring TAB word TAB count)")
    a.add_argument("--class-fallback", choices=["nearest", "own", "error"], default="nearest",
                   help="--class-file: vocabulary words the file does not list join the class of "
                        "the listed word of nearest frequency (nearest, default), one extra class "
                        "(own), or stop training (error)")
    a.add_argument("--direct-order", type=Number(int, 0, MAX_ORDER), default=D.direct_order,
                   help=f"direct n-gram features of orders 1..N (at most --order) added to the output "
                        f"logits (default {D.direct_order}; 0 = none)")
    a.add_argument("--hash-space", type=Number(int, 0, MAX_HASH_SPACE), default=D.hash_space,
                   help="direct features: size of the hashed weight store (default 0: chosen from the "
                        "data, the power of two at least twice the number of distinct n-grams seen "
                        "--min-ngram-freq times, between 4096 and 16M)")
    a.add_argument("--min-ngram-freq", type=Number(int, 1, MAX_INT), default=D.min_ngram_freq,
                   help=f"direct features: only n-grams seen this often in training get a trained weight "
                        f"(default {D.min_ngram_freq})")
    o = p.add_argument_group("training")
    o.add_argument("--noise-samples", "-k", type=Number(int, 0, MAX_NOISE_SAMPLES), default=None,
                   help="NCE noise samples per word; 0 = maximum-likelihood SGD (default 0 for "
                        "--output softmax and tree and with --self-normalise, else 10)")
    o.add_argument("--shared-noise", action="store_true",
                   help="NCE: draw the --noise-samples K noise words once per minibatch and share them "
                        "between all its n-grams (Zoph et al. 2016), so the noise side is three matrix "
                        "products; K then defaults to 200.  Diagonal LBL without direct features "
                        "(--direct-order 0), native or --engine torch; it pays where arithmetic is cheap "
                        "(a GPU, many cores), not on a few CPU cores (docs/training.md)")
    o.add_argument("--row-adagrad", action="store_true",
                   help="one AdaGrad sum per row of the embeddings and output rows (of the row's mean "
                        "squared gradient, as FBGEMM's and TorchRec's embedding tables) instead of one "
                        "per weight: half the optimiser memory of those tables and of the updates' row "
                        "traffic.  The default recipe's fused step (diagonal LBL, NCE) only; "
                        "docs/training.md, 'Threads'")
    o.add_argument("--self-normalise", type=Number(float, 0), default=0.0, metavar="ALPHA",
                   help="ML penalty ALPHA*log(Z)^2 so unnormalised scores act as log-probabilities "
                        "(0.1 with --noise-samples 0: the rescoring recipe, docs/training.md)")
    o.add_argument("--minibatch-size", type=Number(int, 1, 1 << 24), default=D.minibatch_size,
                   help=f"n-grams per update (default {D.minibatch_size})")
    o.add_argument("--iterations", type=Number(int, 1, MAX_INT), default=D.iterations,
                   help=f"epochs over the training data at most (default {D.iterations}; early stopping "
                        "usually ends sooner)")
    o.add_argument("--step-size", type=Number(float, 0, None, lo_open=True), default=D.step_size,
                   help=f"AdaGrad learning rate (default {D.step_size})")
    o.add_argument("--lambda-lbl", type=Number(float, 0), default=D.lambda_lbl,
                   help=f"L2 strength; each minibatch adds lambda*B/N*theta to the weights' gradient "
                        f"(default {D.lambda_lbl:g})")
    o.add_argument("--lr-decay", type=Number(float, 0, 1, lo_open=True), default=D.lr_decay, metavar="FACTOR",
                   help="when --patience evaluations in a row do not improve, go back to the best "
                        "parameters and multiply the step size by FACTOR instead of stopping, at most "
                        "--max-decays times (e.g. 0.5; default 1 = off)")
    o.add_argument("--max-decays", type=Number(int, 0, MAX_INT), default=D.max_decays,
                   help=f"--lr-decay: how many times the step size may be cut before training stops "
                        f"(default {D.max_decays})")
    o.add_argument("--dropout", type=Number(float, 0, 0.99), default=D.dropout, metavar="P",
                   help="training only: drop each unit of the final hidden vector with probability P "
                        "(inverted dropout; the model file is unaffected). Default 0")
    o.add_argument("--init-scale", type=Number(float, 0, None, lo_open=True), default=D.init_scale,
                   help="standard deviation of the random embeddings at the start (default 0.01: "
                        "on Brown 0.01 beat 0.03 and 0.1 by 1-2%% held-out perplexity)")
    o.add_argument("--seed", type=Number(int, 0, (1 << 32) - 1), default=D.seed, help="random seed: same seed and threads, same model (but see --no-hogwild)")
    r = p.add_argument_group("running")
    r.add_argument("--threads", type=THREADS, default=D.threads,
                   help=f"threads for BLAS and the Cython kernels (default {D.threads})")
    r.add_argument("--no-hogwild", dest="hogwild", action="store_false", default=D.hogwild,
                   help="the default recipe's model (diagonal LBL, NCE) with --threads N > 1: share each "
                        "minibatch between the threads (the same model whatever N, each run the same) "
                        "instead of training N minibatches at once, one per thread, without locks "
                        "(Hogwild!: faster, and the run depends on how the threads interleave)")
    r.add_argument("--evals-per-epoch", type=Number(int, 1, MAX_INT), default=D.evals_per_epoch,
                   help=f"held-out evaluations per epoch, the last at its end (default {D.evals_per_epoch})")
    r.add_argument("--eval-every", type=Number(int, 0, MAX_INT), default=0, metavar="N",
                   help="evaluate every N minibatches instead (and at each epoch's end)")
    r.add_argument("--patience", type=Number(int, 0, MAX_INT), default=D.patience,
                   help=f"early stopping: stop after this many evaluations in a row without improvement "
                        f"(default {D.patience}; 0 = never); the best model is what --model-out holds")
    r.add_argument("--max-minutes", type=Number(float, 0), default=0.0,
                   help="stop (after a final evaluation) when this much time has passed (0 = no limit)")
    r.add_argument("--max-updates", type=Number(int, 0, MAX_INT), default=0,
                   help="stop after this many minibatches in this run, leaving a checkpoint to resume from")
    r.add_argument("--checkpoint-minutes", type=Number(float, 0), default=D.checkpoint_minutes,
                   help="also checkpoint this often (minutes) between evaluations")
    r.add_argument("--no-resume", dest="resume", action="store_false",
                   help="ignore (and delete) an existing checkpoint of --model-out and start afresh")
    r.add_argument("--no-tables", dest="tables", action="store_false",
                   help="do not store the precomputed first-layer tables (smaller file, slower queries)")
    r.add_argument("--no-progress", "-q", "--quiet", dest="progress", action="store_false",
                   help="no progress bar")
    r.add_argument("--engine", choices=["native", "torch"], default="native",
                   help="native: numpy + Cython kernels (default); torch: PyTorch on the CPU or a GPU, "
                        "one process or many (torchrun --nproc_per_node N -m nlmfeature.cli train --engine "
                        "torch ...; DDP, gloo on CPUs, NCCL on GPUs); needs pip install 'nlmfeature[torch]'. "
                        "Same models, recipe and model file; joint models are native only")
    r.add_argument("--json", action="store_true", help="print the result as JSON on standard output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nlmfeature.training.trainer import TrainConfig, train

    fields = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__}
    cfg = TrainConfig(**fields)
    from nlmfeature.training.trainer import TrainingInterrupted

    if cfg.init_model:   # the model's architecture, before the settings are checked
        from nlmfeature.core.modelfile import read_model

        cfg = cfg.for_model(read_model(cfg.init_model, verify=False)[0])
    check_settings(cfg)
    if getattr(args, "engine", "native") == "torch":
        try:
            from nlmfeature.training.torch_engine import train
        except ImportError as exc:
            raise NLMFeatureError(f"--engine torch: {exc}") from None
    try:
        result = train(cfg)
    except TrainingInterrupted as exc:
        args.interrupt_hint = str(exc)
        raise
    except KeyboardInterrupt:
        args.interrupt_hint = "aborted: the last checkpoint is kept; run the same command again to resume"
        raise
    if int(os.environ.get("RANK", "0")):
        return 0    # a torchrun rank other than 0: rank 0 reports
    if args.json:
        print(dumps_json(result.as_dict(), indent=2))
    else:
        best = (f"best held-out perplexity {result.best_perplexity:.2f} at epoch {result.best_epoch}"
                if result.best_perplexity < float("inf") else f"{result.epochs} epochs (no --test-set)")
        print(f"model: {result.model_out}  {best}  ({result.words_per_second:.0f} words/s)", file=sys.stdout)
    return 0


def check_settings(cfg) -> None:
    """Refuse settings that cannot make a model, before any data is read: the estimator
    (flag pairs such as --self-normalise with NCE) and the architecture, built once with a
    small vocabulary and checked as the model file will be (e.g. ``--output tree`` with
    direct features), so training does not run its epochs to refuse the model at the end."""
    import numpy as np

    from nlmfeature.core.architecture import random_model
    from nlmfeature.core.modelfile import validate_structure
    from nlmfeature.core.vocab import SPECIALS, Vocabulary

    try:
        cfg.estimator()
    except ValueError as exc:
        raise NLMFeatureError(f"impossible settings: {exc}") from None
    spec = cfg.spec()
    n = max(8, 2 * (spec.classes or 0))
    vocab = Vocabulary(list(SPECIALS) + [f"w{i}" for i in range(n)])
    counts = np.arange(len(vocab), 0, -1, dtype=np.float64)
    # the layout is what matters, not the sizes: small widths and store
    spec.word_width = min(spec.word_width, 8)
    spec.hidden = min(spec.hidden, 8)
    spec.hidden_layers = [min(w, 8) for w in spec.hidden_layers]
    spec.hash_space = min(spec.hash_space or 1 << 10, 1 << 10)   # 0: sized from the data later
    try:
        header, arrays = random_model(spec, vocab, counts, seed=1,
                                      source_vocab=vocab if spec.source_window else None)
        validate_structure(header, arrays)
    except (ValueError, KeyError, TypeError) as exc:
        raise NLMFeatureError(f"impossible settings: these flags do not make a consistent "
                              f"model: {exc}") from None
