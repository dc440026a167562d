"""``nlmfeature train``: train a neural language model on tokenised text."""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import NLMFeatureError

EPILOG = """\
estimators:
  --noise-samples K > 0 with --output unnormalised   noise-contrastive estimation (NCE),
                                                      scores self-normalised (log Z ~ 0)
  --noise-samples K > 0 with --output class          class-factored NCE (Baltescu & Blunsom 2015)
  --noise-samples K > 0 with --output softmax        NCE training, exact softmax at test time
  --noise-samples 0 with --output softmax|class|tree maximum likelihood (minibatch AdaGrad)
  --noise-samples 0 --self-normalise A --output unnormalised
                                                      ML + A*log(Z)^2 (Devlin et al. 2014)

threads: --threads N sizes the BLAS pool at run time; the Cython kernels use N threads only
  when OMP_WAIT_POLICY=passive is in the environment (spinning OpenMP threads otherwise
  starve BLAS), e.g.  OMP_WAIT_POLICY=passive nlmfeature train --threads 2 ...

resuming: a checkpoint MODEL_OUT.ckpt.npz is written at every evaluation, every
  --checkpoint-minutes and on Ctrl-C; running the same command again resumes from it
  (--no-resume starts afresh).  The same --seed and --threads give the same model.

example (joint model, German-English parallel text with its fast_align alignment):
  nlmfeature train --source train.de.gz --train train.en.gz --alignment train.align.gz \
      --test-source dev.de --test-set dev.en --test-alignment dev.align --model-out joint.nlm \
      --output class --classes 100 --noise-samples 10 --source-window 7

example (Brown corpus, class-factored NCE log-bilinear model):
  nlmfeature train --train train.txt.gz --test-set valid.txt.gz --model-out brown.nlm \\
      --order 5 --word-width 200 --diagonal-contexts --output class --classes 128 \\
      --noise-samples 10 --iterations 10 --min-count 4
"""


def _layers(text: str):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated widths, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model on tokenised text (NCE, class NCE, ML)",
                       description="Train a feed-forward neural language model on tokenised text "
                                   "(one sentence per line, plain or .gz) and write it in the "
                                   "nlmfeature model format.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--train", "-c", required=True, metavar="FILE",
                   help="training text: tokenised, one sentence per line, UTF-8, plain or .gz")
    g.add_argument("--test-set", metavar="FILE",
                   help="held-out text: its perplexity picks the best model (written when it improves)")
    g.add_argument("--model-out", "-m", required=True, metavar="FILE", help="where to write the model")
    g.add_argument("--min-count", type=int, default=2,
                   help="words seen fewer times become <unk> (default 2: singletons, as OxLM)")
    g.add_argument("--max-vocab", type=int, default=None,
                   help="keep at most this many vocabulary entries (specials included), most frequent first")
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
    j.add_argument("--source-window", type=int, default=7, metavar="W",
                   help="source words the model sees, 2m+1 centred on the affiliated word "
                        "(default 7, Devlin et al. 2014's window)")
    a = p.add_argument_group("architecture")
    a.add_argument("--arch", choices=["lbl", "nplm", "lateral"], default="lbl",
                   help="log-bilinear (OxLM), NPLM (Vaswani et al.) or lateral branches (default lbl)")
    a.add_argument("--order", type=int, default=5, help="n-gram order n: the model sees n-1 words (default 5)")
    a.add_argument("--word-width", type=int, default=100, help="word embedding dimension E (default 100)")
    a.add_argument("--hidden", type=int, default=0,
                   help="first-layer width (nplm/lateral; lbl uses E); 0 = 750 for nplm, 500 for lateral")
    a.add_argument("--diagonal-contexts", action="store_true",
                   help="lbl: diagonal context matrices (OxLM's --diagonal-contexts)")
    a.add_argument("--activation", default="identity",
                   choices=["identity", "sigmoid", "relu", "tanh", "hardtanh"],
                   help="first-layer activation (default identity for lbl; nplm/lateral switch it to relu)")
    a.add_argument("--hidden-layers", type=_layers, default=[], metavar="W1,W2",
                   help="widths of extra hidden layers, e.g. 150 for NPLM's 150-750-150")
    a.add_argument("--branches", type=int, default=1, help="lateral: number of side-by-side first layers")
    a.add_argument("--combine", choices=["none", "max", "add", "mul"], default="none",
                   help="lateral: how branches are combined (default max)")
    a.add_argument("--output", choices=["unnormalised", "softmax", "class", "tree"], default="class",
                   help="output layer (default class: class-factored with --classes or --class-file)")
    a.add_argument("--classes", type=int, default=100,
                   help="class output: number of frequency-binned classes (default 100)")
    a.add_argument("--class-file", metavar="FILE",
                   help="class output: Brown clusters in wcluster's paths format (bitstring TAB word TAB count)")
    a.add_argument("--class-fallback", choices=["nearest", "own", "error"], default="nearest",
                   help="--class-file: vocabulary words the file does not list join the class of "
                        "the listed word of nearest frequency (nearest, default), one extra class "
                        "(own), or stop training (error)")
    a.add_argument("--direct-order", type=int, default=0,
                   help="direct n-gram features of orders 1..N added to the output logits (0 = none)")
    a.add_argument("--hash-space", type=int, default=0,
                   help="direct features: size of the hashed weight store (default 2^20)")
    a.add_argument("--min-ngram-freq", type=int, default=1,
                   help="direct features: only n-grams seen this often in training get a trained weight")
    o = p.add_argument_group("training")
    o.add_argument("--noise-samples", "-k", type=int, default=0,
                   help="NCE noise samples per word; 0 = maximum-likelihood SGD (default 0)")
    o.add_argument("--self-normalise", type=float, default=0.0, metavar="ALPHA",
                   help="ML penalty ALPHA*log(Z)^2 so unnormalised scores act as log-probabilities")
    o.add_argument("--minibatch-size", type=int, default=1000, help="n-grams per update (default 1000)")
    o.add_argument("--iterations", type=int, default=10, help="epochs over the training data (default 10)")
    o.add_argument("--step-size", type=float, default=0.05, help="AdaGrad learning rate (default 0.05)")
    o.add_argument("--lambda-lbl", type=float, default=0.0,
                   help="L2 strength; each minibatch adds lambda*B/N*theta to the weights' gradient")
    o.add_argument("--lr-decay", type=float, default=1.0, metavar="FACTOR",
                   help="when a held-out evaluation does not improve, go back to the best parameters and "
                        "multiply the step size by FACTOR (e.g. 0.5; default 1 = off); use with --patience")
    o.add_argument("--dropout", type=float, default=0.0, metavar="P",
                   help="training only: drop each unit of the final hidden vector with probability P "
                        "(inverted dropout; the model file is unaffected). Default 0")
    o.add_argument("--init-scale", type=float, default=0.01,
                   help="standard deviation of the random embeddings at the start (default 0.01: "
                        "on Brown 0.01 beat 0.03 and 0.1 by 1-2%% held-out perplexity)")
    o.add_argument("--seed", type=int, default=1, help="random seed: same seed and threads, same model")
    r = p.add_argument_group("running")
    r.add_argument("--threads", type=int, default=2, help="threads for BLAS and the Cython kernels (default 2)")
    r.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="also evaluate the test set every N minibatches (default: once per epoch)")
    r.add_argument("--patience", type=int, default=0,
                   help="stop after this many evaluations without improvement (0 = never)")
    r.add_argument("--max-minutes", type=float, default=0.0,
                   help="stop (after a final evaluation) when this much time has passed (0 = no limit)")
    r.add_argument("--max-updates", type=int, default=0,
                   help="stop after this many minibatches in this run, leaving a checkpoint to resume from")
    r.add_argument("--checkpoint-minutes", type=float, default=10.0,
                   help="also checkpoint this often (minutes) between evaluations")
    r.add_argument("--no-resume", dest="resume", action="store_false",
                   help="ignore (and delete) an existing checkpoint of --model-out and start afresh")
    r.add_argument("--no-tables", dest="tables", action="store_false",
                   help="do not store the precomputed first-layer tables (smaller file, slower queries)")
    r.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    r.add_argument("--json", action="store_true", help="print the result as JSON on standard output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..training.trainer import TrainConfig, train

    fields = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__}
    cfg = TrainConfig(**fields)
    try:
        result = train(cfg)
    except KeyboardInterrupt:
        raise NLMFeatureError("aborted (the last checkpoint is kept; run the command again to resume)") from None
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        best = (f"best held-out perplexity {result.best_perplexity:.2f} at epoch {result.best_epoch}"
                if result.best_perplexity < float("inf") else f"{result.epochs} epochs (no --test-set)")
        print(f"model: {result.model_out}  {best}  ({result.words_per_second:.0f} words/s)", file=sys.stdout)
    return 0
