"""The training loop: minibatch AdaGrad, held-out perplexity, checkpoints, best-model writing.

>>> from nlmfeature.training.trainer import TrainConfig, train
>>> cfg = TrainConfig(train="train.txt", test_set="valid.txt", model_out="lm.nlm",
...                   order=5, word_width=100, output="class", classes=100,
...                   noise_samples=10, iterations=5)     # doctest: +SKIP
>>> result = train(cfg)                                  # doctest: +SKIP

The model is initialised by :func:`nlmfeature.core.architecture.random_model` and written with
:func:`nlmfeature.save` in the model-file format the scorer reads, so that
``nlmfeature.load(cfg.model_out)`` scores with exactly the trained parameters.

* Estimator: ``--noise-samples k > 0`` trains with NCE (``unnormalised``/``softmax`` output)
  or class-factored NCE (``class`` output); ``k = 0`` with maximum likelihood (softmax,
  class- or tree-factored; ``unnormalised`` output needs ``--self-normalise ALPHA``).
* Held-out perplexity on ``--test-set`` is computed with the scorer itself (an in-memory
  :class:`nlmfeature.Model` over the current arrays) every ``eval_every`` minibatches and at the
  end of every epoch; a new best is written to ``model_out`` at once (atomically).
* Checkpoints (``model_out + '.ckpt.npz'``: parameters, AdaGrad sums, position, history;
  plain arrays, no pickle) are written atomically at every evaluation, every
  ``checkpoint_minutes`` and on Ctrl-C; a later run with the same settings resumes from
  there and produces what an uninterrupted run would have.
* The same seed (and thread count) gives the same model: the epoch order comes from
  ``numpy.random.default_rng([seed, epoch])`` and noise from a counter-based generator.
* Joint models (NNJM): ``source`` and ``alignment`` (and ``test_source`` /
  ``test_alignment`` for the held-out set) make ``train`` the target side of a parallel text;
  each target word also sees ``source_window`` source words around its affiliated source
  position (:mod:`nlmfeature.joint`).  Training works on one combined input table (target
  rows, then source rows) and a context of w + n-1 positions; the model file keeps the
  source embeddings apart (``source.embeddings``).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from nlmfeature.core import modelfile
from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model, set_null_embedding
from nlmfeature.io.atomicfile import atomic_open, check_output
from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.core.model import Model, exactly_normalised
from nlmfeature.core.vocab import Vocabulary
from nlmfeature.training.corpus import NgramData, build_vocabulary
from nlmfeature.training.estimators import OutputSpec
from nlmfeature.training.objective import Objective, dropout_mask, trainable_names
from nlmfeature.training.optim import AdaGrad, Gradients
from nlmfeature.training import arrays
from nlmfeature.training.sampling import ClassNoise, UnigramNoise
from nlmfeature.training.threads import kernel_threads, set_blas_threads

CHECKPOINT_VERSION = 1
#: noise words per minibatch with --shared-noise and no --noise-samples
SHARED_NOISE_SAMPLES = 200


@dataclass
class TrainConfig:
    """Every setting of a training run (the ``nlmfeature train`` flags, whose defaults are
    these).  The defaults are the recipe measured best for the product's use, decoding
    (docs/training.md, "Choosing a recipe"; figures in docs/results.md): an 8-gram log-bilinear
    model with diagonal context matrices, 200-wide embeddings, NCE with 10 noise samples (a
    self-normalised output: one dot product per decoder query), direct n-gram features of orders
    1-3, minibatches of 250 with L2 20, four held-out evaluations per epoch and early stopping
    after four without improvement.  ``output="softmax"`` (then maximum likelihood) gives the
    lowest perplexity, for rescoring and perplexity, at a
    pass over the vocabulary per query in a decoder and several times the training time."""

    train: str = ""
    model_out: str = ""
    test_set: Optional[str] = None
    # joint models: the source side of the parallel text and its i-j word alignment
    source: Optional[str] = None
    alignment: Optional[str] = None
    test_source: Optional[str] = None
    test_alignment: Optional[str] = None
    source_window: int = 7
    target_to_source: bool = False  # predict the source words given a window of the target's
    # vocabulary
    min_count: int = 2
    reverse: bool = False
    max_vocab: Optional[int] = None
    # architecture
    arch: str = "lbl"
    order: int = 8
    word_width: int = 200
    hidden: int = 0
    diagonal_contexts: bool = True
    activation: str = "identity"
    hidden_layers: List[int] = field(default_factory=list)
    branches: int = 1
    combine: str = "none"
    output: str = "unnormalised"
    classes: int = 100
    class_file: Optional[str] = None
    class_fallback: str = "nearest"
    direct_order: int = 3
    hash_space: int = 0                     # 0: chosen from the data (choose_hash_space)
    min_ngram_freq: int = 2
    # estimator and optimiser
    noise_samples: Optional[int] = None     # None: 0 (ML) for softmax / tree / --self-normalise, else 10 (NCE)
    shared_noise: bool = False              # NCE noise drawn once per minibatch, shared by its n-grams
    row_adagrad: bool = False               # one AdaGrad sum per embedding and output row (fused step)
    hogwild: bool = True                    # fused step, threads > 1: one minibatch per thread, lock-free
    self_normalise: float = 0.0
    minibatch_size: int = 250
    iterations: int = 20
    step_size: float = 0.05
    lambda_lbl: float = 20.0
    lr_decay: float = 1.0
    max_decays: int = 2
    dropout: float = 0.0
    init_scale: float = 0.01
    # running
    threads: int = 2
    seed: int = 1
    eval_every: int = 0
    evals_per_epoch: int = 4
    patience: int = 4
    max_minutes: float = 0.0
    max_updates: int = 0
    checkpoint_minutes: float = 10.0
    resume: bool = True
    tables: bool = True
    progress: bool = True
    corpus_dir: str = ""                    # where texts are compiled ("": default_corpus_dir())
    # continued training (domain adaptation): start from this model's parameters and vocabulary
    init_model: Optional[str] = None

    def __post_init__(self) -> None:
        if self.noise_samples is None:
            self.noise_samples = (0 if self.output in ("softmax", "tree") or self.self_normalise
                                  else SHARED_NOISE_SAMPLES if self.shared_noise else 10)

    def spec(self) -> ModelSpec:
        """The architecture to build."""
        return ModelSpec(arch=self.arch, order=self.order, word_width=self.word_width, hidden=self.hidden,
                         diagonal_contexts=self.diagonal_contexts, activation=self.activation,
                         hidden_layers=list(self.hidden_layers), branches=self.branches,
                         combine=self.combine, output=self.output,
                         classes=self.classes if self.output == "class" else 0,
                         direct_order=0 if self.source else min(self.direct_order, self.order),
                         hash_space=self.hash_space,
                         source_window=self.source_window if self.source else 0)

    def estimator(self) -> str:
        """The estimator these settings select (raises ValueError for impossible pairs)."""
        k, out = self.noise_samples, self.output
        if k < 0:
            raise ValueError("--noise-samples must be >= 0")
        if self.self_normalise < 0:
            raise ValueError("--self-normalise must be >= 0")
        if self.self_normalise and out not in ("unnormalised", "softmax"):
            raise ValueError("--self-normalise applies to the unnormalised and softmax outputs "
                             "(class- and tree-factored models are normalised exactly)")
        if self.self_normalise and k:
            raise ValueError("--self-normalise is a maximum-likelihood penalty: use it with "
                             "--noise-samples 0 (NCE self-normalises by itself)")
        if self.shared_noise and not k:
            raise ValueError("--shared-noise draws NCE noise: it needs --noise-samples K > 0")
        if out == "tree":
            if k:
                raise ValueError("the tree output is trained by maximum likelihood: use --noise-samples 0")
            return "tree-ml"
        if out == "class":
            return "class-nce" if k else "class-ml"
        if k:
            return "nce"
        if out == "unnormalised" and not self.self_normalise:
            raise ValueError("an unnormalised output needs NCE (--noise-samples K) or a "
                             "self-normalisation penalty (--self-normalise ALPHA)")
        return "softmax"

    def for_model(self, header: Dict[str, Any]) -> "TrainConfig":
        """These settings for continuing the training of a model with ``header``
        (``init_model``): the architecture, output layer, direct-feature store and direction
        are the model's.  A setting left at its default takes the model's value; one set to
        something else must agree with it (else :class:`NLMFeatureError` names it).  The
        estimator (NCE or maximum likelihood, noise samples, self-normalisation) is the one the
        model was trained with, from its metadata, unless given.  Joint models are refused."""
        name = self.init_model or "the initial model"
        if header.get("source"):
            raise NLMFeatureError(f"{name}: continuing the training of a joint model is not "
                                  "supported (train it again on the combined parallel text)")
        if self.source:
            raise NLMFeatureError(f"--init-model continues a target-only model; --source "
                                  "makes a joint model")
        if self.min_count != TrainConfig.min_count or self.max_vocab is not None:
            raise NLMFeatureError(f"--min-count and --max-vocab do not apply with --init-model: "
                                  f"the vocabulary is {name}'s")
        if self.class_file:
            raise NLMFeatureError(f"--class-file does not apply with --init-model: the classes "
                                  f"are {name}'s")
        fixed = model_settings(header)
        defaults = TrainConfig()
        changes: Dict[str, Any] = {}
        for key, value in fixed.items():
            mine = getattr(self, key)
            if mine == value:
                continue
            if mine != getattr(defaults, key):
                flag = "--" + key.replace("_", "-")
                raise NLMFeatureError(f"{flag} {mine} disagrees with {name} ({value}): the "
                                      "architecture of a continued model is the initial model's; "
                                      f"leave out {flag}")
            changes[key] = value
        meta = header.get("metadata") or {}
        resolved = TrainConfig(output=self.output, shared_noise=self.shared_noise)
        if (self.noise_samples == resolved.noise_samples and not self.self_normalise
                and isinstance(meta.get("noise_samples"), int)):
            changes["noise_samples"] = meta["noise_samples"]
            if isinstance(meta.get("self_normalise"), (int, float)):
                changes["self_normalise"] = float(meta["self_normalise"])
            changes["shared_noise"] = bool(meta.get("shared_noise", False))
        elif "output" in changes and self.noise_samples == resolved.noise_samples:
            changes["noise_samples"] = None     # resolved again for the model's output layer
        fields = dict(asdict(self), **changes)
        return TrainConfig(**fields)

    def fingerprint(self) -> str:
        """Hash of the settings that must not change when a run is resumed."""
        keep = {k: v for k, v in asdict(self).items()
                if k not in ("iterations", "threads", "eval_every", "evals_per_epoch", "patience", "max_decays",
                             "max_minutes", "max_updates",
                             "checkpoint_minutes", "resume", "tables", "progress", "model_out",
                             "corpus_dir")}
        if not self.source:  # target-only runs: the joint settings do not apply
            for k in ("source", "alignment", "test_source", "test_alignment", "source_window"):
                keep.pop(k, None)
        if not self.row_adagrad:  # checkpoints of runs before the setting existed still resume
            keep.pop("row_adagrad")
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class TrainResult:
    """What a run did."""

    model_out: str
    best_perplexity: float
    best_epoch: float
    epochs: float
    words_per_second: float
    history: List[Dict[str, float]]
    vocab_size: int
    train_tokens: int
    estimator: str
    resumed_from: Optional[str] = None
    trained_words: int = 0           #: target words trained on (all runs of a resumed model)
    train_seconds: float = 0.0       #: seconds in the minibatch loop (``words_per_second``'s divisor)

    def as_dict(self) -> Dict[str, Any]:
        """Plain JSON-able values (no held-out set: ``best_perplexity`` is None)."""
        d = asdict(self)
        if not math.isfinite(d["best_perplexity"]):
            d["best_perplexity"] = None
        return d


# ---------------------------------------------------------------------------------------
# setting up
# ---------------------------------------------------------------------------------------

def model_settings(header: Dict[str, Any]) -> Dict[str, Any]:
    """The :class:`TrainConfig` settings a model file fixes (its architecture, output layer,
    direct-feature store and direction), from its header."""
    br = header["branches"][0]
    out, direct = header["output"], header.get("direct") or {}
    fixed = {"arch": header["arch"], "order": int(header["order"]), "word_width": int(header["embed_dim"]),
             "diagonal_contexts": bool(br["diagonal"]), "activation": br["activation"],
             "hidden_layers": [int(ly["n_out"]) for ly in header["layers"]],
             "output": out["type"], "direct_order": int(direct.get("order", 0)),
             "hash_space": int(direct.get("hash_space", 0)),
             "reverse": bool((header.get("metadata") or {}).get("reverse", False))}
    if header["arch"] != "lbl":
        fixed.update(hidden=int(br["hidden"]), branches=len(header["branches"]),
                     combine=header.get("combine", "none"))
    if out["type"] == "class":
        fixed["classes"] = int(out["classes"])
    return fixed


def class_partition(path: str, vocab: Vocabulary, counts: np.ndarray, unknown: str = "nearest") -> np.ndarray:
    """class_of_word for a vocabulary from a Brown-cluster paths file (``bitstring TAB word TAB
    count``), read by :func:`nlmfeature.training.clusters.load_class_of_word`.  Vocabulary words the
    file does not list get a class per ``unknown``: ``nearest`` (the class of the listed word
    of nearest frequency), ``own`` (one extra class for all of them) or ``error``."""
    from nlmfeature.training.clusters import load_class_of_word

    if not os.path.exists(path):
        raise InputError(path, 0, "no such class file")
    return np.asarray(load_class_of_word(path, vocab, counts, unknown=unknown), dtype=np.int32)


#: the direct-feature hash space chosen from the data lies in [2^MIN, 2^MAX] (--hash-space 0)
HASH_SPACE_BITS = (12, 24)
#: bytes of the count-min sketch that counts direct-feature n-grams (fixed: the memory of the
#: count does not grow with the text)
SKETCH_BYTES = 1 << 27


def _sketch(n_keys: int) -> np.ndarray:
    """A count-min sketch sized for ``n_keys`` n-gram occurrences (at most :data:`SKETCH_BYTES`)."""
    size = 1 << max(12, min(SKETCH_BYTES.bit_length() - 1, int(4 * max(1, n_keys)).bit_length()))
    return np.zeros(size, dtype=np.uint8)


def frequent_ngrams(data, order: int, min_freq: int) -> int:
    """Distinct word n-grams of orders 1..``order`` (the direct features' keys) seen at least
    ``min_freq`` times in ``data`` (anything with ``chunks()``: an in-memory
    :class:`NgramData` or a compiled corpus's :class:`NgramStream`), counted in one streaming
    pass with fixed memory (a count-min sketch: a slight over-estimate)."""
    from nlmfeature import _train

    sketch = _sketch(len(data) * order)
    none = np.zeros(0, dtype=np.uint8)
    total = 0
    for ctx, words in data.chunks():
        total += _train.direct_count(ctx, words, 0, order, sketch, min(255, min_freq), none, np.uint64(1))
    return total


def choose_hash_space(data, order: int, min_freq: int) -> int:
    """The direct-feature hash space for ``data``: the power of two at least twice the number
    of frequent n-grams (:func:`frequent_ngrams`), within :data:`HASH_SPACE_BITS`, so that few
    n-grams share a bucket and a small text gets a small model."""
    n = frequent_ngrams(data, order, min_freq)
    lo, hi = HASH_SPACE_BITS
    return 1 << max(lo, min(hi, int(2 * n - 1).bit_length()))


def direct_filter(data, header: Dict[str, Any], min_freq: int, kind_classes: Optional[np.ndarray]
                  ) -> Optional[np.ndarray]:
    """Buckets that may be trained: those of training n-grams seen at least ``min_freq``
    times (word features; for a class output also the class n-grams), counted in one
    streaming pass over ``data`` (see :func:`frequent_ngrams`).  Other buckets keep their
    initial value 0, so n-grams below the cut contribute nothing at test time unless they
    share a bucket with a frequent one (hash collisions)."""
    from nlmfeature import _train

    d = header["direct"]
    hs = int(d["hash_space"])
    allowed = np.zeros(hs, dtype=np.uint8)
    kinds = [0] if kind_classes is None else [0, 1]
    sketches = [_sketch(len(data) * d["order"]) for _ in kinds]
    for ctx, words in data.chunks():
        for kind, sketch in zip(kinds, sketches):
            targets = words if kind == 0 else np.ascontiguousarray(kind_classes[words], dtype=np.int32)
            _train.direct_count(ctx, targets, kind, d["order"], sketch, min(255, max(1, min_freq)),
                                allowed, np.uint64(hs))
    return None if allowed.all() else allowed


def export_arrays(header: Dict[str, Any], template: Dict[str, np.ndarray], params: Dict[str, np.ndarray],
                  vocab: Vocabulary, tables: bool, own: bool = False) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(header, arrays) of a model file holding the current parameters, with the ``<null>``
    embedding set to the unigram-weighted average and, if ``tables``, precomputed tables.
    A joint model's combined training table ``embeddings`` (target rows, then source rows)
    is split into ``embeddings`` and ``source.embeddings``.

    The arrays are the parameters themselves where they can be: use them before the next
    update.  The embeddings are a copy, or with ``own`` the trained ones themselves, their
    ``<null>`` row overwritten (the caller puts it back: :meth:`Trainer.exported`; a joint
    model's split tables are copies either way).  A copy of every parameter at each held-out
    evaluation and each write was most of a large run's peak memory."""
    h = json.loads(json.dumps(header))
    arrays = {n: a for n, a in template.items() if not n.endswith(".tables")}
    for n, p in params.items():
        arrays[n] = np.ascontiguousarray(p, dtype=np.float32)
    if h.get("source") and arrays["embeddings"].shape[0] > len(vocab):
        arrays["source.embeddings"] = np.ascontiguousarray(arrays["embeddings"][len(vocab):])
        arrays["embeddings"] = np.ascontiguousarray(arrays["embeddings"][:len(vocab)])
    set_null_embedding(arrays, vocab, own=own)
    h["precomputed"] = False
    if tables:
        precompute_tables(h, arrays)
    return h, arrays


def initial_model(header: Dict[str, Any], arrays: Dict[str, np.ndarray]
                  ) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(header, arrays) to continue training from, out of a model file's: its float arrays
    as float32 (views of a float32 file's mapping: the trainer copies what it trains), the
    structure arrays as they are, no precomputed tables (computed again from the trained
    weights)."""
    h = json.loads(json.dumps(header))
    for key in ("metadata", "storage"):
        h.pop(key, None)
    h["precomputed"] = False
    out = {}
    for name, a in arrays.items():
        if name.endswith(".tables"):
            continue
        out[name] = np.asarray(a, dtype=np.float32) if a.dtype.kind == "f" else np.asarray(a)
    return h, out


def heldout_logprob(header: Dict[str, Any], arrays: Dict[str, np.ndarray], data: NgramData,
                    exact: bool = False) -> np.ndarray:
    """Per-n-gram natural-log scores of held-out data by the scorer, over in-memory arrays;
    ``exact`` renormalises an unnormalised model exactly
    (:func:`nlmfeature.core.model.exactly_normalised`)."""
    model = Model("<in-memory>", header, arrays, "", use_tables=bool(header.get("precomputed")),
                  hot_copies=False)
    return (exactly_normalised(model) if exact else model).score_batch(data.contexts, data.words)


def _atomic_savez(path: str, arrays: Dict[str, np.ndarray]) -> None:
    with atomic_open(path, suffix=".npz") as f:
        np.savez(f, **arrays)


def checkpoint_path(model_out: str) -> str:
    """Where a run's checkpoint lives."""
    return model_out + ".ckpt.npz"


# ---------------------------------------------------------------------------------------
# the trainer
# ---------------------------------------------------------------------------------------

class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped a run after it wrote its checkpoint; ``str()`` says where."""


class Trainer:
    """One training run (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] = None) -> None:
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        init = None
        if cfg.init_model:  # continued training: the model's architecture, vocabulary, weights
            init = modelfile.read_model(cfg.init_model)[:2]
            cfg = cfg.for_model(init[0])
        #: whether training continues from ``init_model``'s weights
        self.continued = init is not None
        self.cfg = cfg
        if not cfg.train:
            raise NLMFeatureError("no training text given")
        if not cfg.model_out:
            raise NLMFeatureError("no --model-out given")
        try:
            self.estimator = cfg.estimator()
            spec = cfg.spec().normalised()
        except ValueError as exc:
            raise NLMFeatureError(str(exc)) from None
        if cfg.order < 1 or cfg.order > 16:
            raise NLMFeatureError("--order must be between 1 and 16")
        if cfg.minibatch_size < 1 or cfg.iterations < 0:
            raise NLMFeatureError("--minibatch-size must be >= 1 and --iterations >= 0")
        if not 0 <= cfg.dropout < 1:
            raise NLMFeatureError("--dropout must be in [0, 1)")
        if cfg.direct_order < 0:
            raise NLMFeatureError("--direct-order must be >= 0")
        if cfg.patience < 0 or cfg.evals_per_epoch < 1 or cfg.eval_every < 0:
            raise NLMFeatureError("--patience and --eval-every must be >= 0, --evals-per-epoch >= 1")
        if not 0 < cfg.lr_decay <= 1:
            raise NLMFeatureError("--lr-decay must be in (0, 1]")
        if cfg.lr_decay < 1 and not (cfg.patience and cfg.test_set):
            raise NLMFeatureError("--lr-decay acts when --patience evaluations in a row on --test-set "
                                  "do not improve: give --test-set and --patience >= 1")
        self.source_vocab: Optional[Vocabulary] = None
        self.source_counts: Optional[np.ndarray] = None
        self.heldout: Optional[NgramData] = None
        self.heldout_oov = 0
        if cfg.source:
            if cfg.reverse:
                raise NLMFeatureError("--reverse applies to target-only models, not to joint models (--source)")
            self._read_parallel(spec)
        else:
            if cfg.alignment or cfg.test_source or cfg.test_alignment or cfg.target_to_source:
                raise NLMFeatureError("--alignment, --test-source, --test-alignment and "
                                      "--target-to-source belong to a joint model: give --source too")
            self._read_target(Vocabulary.from_arrays(init[1]["vocab.offsets"], init[1]["vocab.bytes"])
                              if init else None)
        if spec.direct_order and not cfg.hash_space:
            spec.hash_space = choose_hash_space(self.data, spec.direct_order, max(1, cfg.min_ngram_freq))
            self.log(f"direct n-gram features: hash space {spec.hash_space} (from the data; --hash-space sets it)")
        class_of_word = None
        if cfg.output == "class" and cfg.class_file:
            class_of_word = class_partition(cfg.class_file, self.vocab, self.counts, cfg.class_fallback)
            spec.classes = int(class_of_word.max()) + 1
        elif cfg.output == "class" and cfg.classes > len(self.vocab):
            raise NLMFeatureError(f"--classes {cfg.classes} exceeds the vocabulary size {len(self.vocab)}")
        # counts for initialisation/structure: <s> and <null> are never predicted
        struct_counts = self.counts.copy()
        if init:
            self.header, self.template = initial_model(*init)
            del init   # the file's arrays live on in the template and the parameters
            self.log(f"continuing the training of {cfg.init_model} ({len(self.vocab):,} words, "
                     f"order {cfg.order}, {cfg.output} output)")
        else:
            self.header, self.template = random_model(spec, self.vocab, struct_counts, seed=cfg.seed,
                                                      scale=cfg.init_scale, class_of_word=class_of_word,
                                                      source_vocab=self.source_vocab,
                                                      source_counts=self.source_counts)
        self.header.setdefault("metadata", {})
        names = trainable_names(self.header, self.template)
        # the trained arrays move out of the template (which keeps the fixed ones: class tables,
        # vocabulary), so that a run holds one copy of them, not the initial model besides
        self.params = {n: arrays.copy(np.asarray(self.template.pop(n), dtype=np.float32)) for n in names}
        train_header = self.header
        if spec.source_window:  # one input table, target rows then source rows; w + n-1 positions
            self.params["embeddings"] = arrays.copy(np.concatenate(
                [self.params["embeddings"], self.params.pop("source.embeddings")]))
            names = [n for n in names if n != "source.embeddings"]
            train_header = dict(self.header, order=cfg.order + spec.source_window)
        if "direct.weights" in self.params and not self.continued:
            self.params["direct.weights"][...] = 0.0
        h = self.header
        dense = bool(h["layers"]) or not all(b["diagonal"] for b in h["branches"]) or self.estimator == "softmax"
        kt = self.kernel_threads = kernel_threads(cfg.threads, dense)
        ospec = OutputSpec(estimator=self.estimator, k=cfg.noise_samples, alpha=cfg.self_normalise,
                           threads=kt)
        self.noise = None
        noise_counts = self.counts.copy()
        if self.continued:   # words the new text lacks: a vanishing share, so no class is empty
            noise_counts[noise_counts == 0] = 1e-6
            noise_counts[[self.vocab.bos, self.vocab.null]] = 0
        if self.estimator == "nce":
            self.noise = UnigramNoise(noise_counts, cfg.noise_samples)
            ospec.logq = self.noise.logq
        elif self.estimator == "class-nce":
            a = self.template
            self.noise = ClassNoise(noise_counts, a["class.of_word"], a["class.start"], a["class.members"],
                                    cfg.noise_samples)
            ospec.logq, ospec.logq_class = self.noise.logq_word, self.noise.logq_class
        d = self.header.get("direct")
        if d:
            ospec.direct_order, ospec.hash_space = d["order"], d["hash_space"]
            ospec.allowed = direct_filter(self.data, self.header, max(1, cfg.min_ngram_freq),
                                          self.template["class.of_word"] if cfg.output == "class" else None)
            if self.continued and ospec.allowed is not None:   # the initial model's features train on
                ospec.allowed |= (self.params["direct.weights"] != 0).view(np.uint8)
        live = {n: a for n, a in self.template.items() if n not in self.params}
        live.update(self.params)  # the same arrays the optimiser updates
        live.pop("source.embeddings", None)
        self.objective = Objective(train_header, live, ospec, threads=kt)
        self._fused = self.fused()
        # the fused kernels sum their gradients themselves
        self.grads = None if self._fused else Gradients(self.params, names, threads=kt)
        # the direct-feature filter as the fused kernels read it: a bit per bucket
        self._allowed_bits = (np.packbits(ospec.allowed, bitorder="little") if ospec.allowed is not None
                              else np.zeros(0, dtype=np.uint8))
        if cfg.row_adagrad and not self._fused:
            raise NLMFeatureError("--row-adagrad applies to the fused step of the diagonal log-bilinear model "
                             "trained by NCE (the default recipe) without dropout or hidden layers")
        self.opt = AdaGrad(self.params, names, cfg.step_size, threads=kt,
                           row_sums=("embeddings", "output.weight") if cfg.row_adagrad else ())
        if cfg.shared_noise and not (self._fused and "direct.weights" not in self.params):
            raise NLMFeatureError("--shared-noise trains the diagonal log-bilinear model with an unnormalised or "
                             "softmax output by NCE, without direct features, dropout or hidden layers: "
                             "add --direct-order 0 (or leave out --shared-noise)")
        # position
        self.epoch = 0
        self.batch = 0
        self.step = 0
        self.best = math.inf
        self.best_epoch = 0.0
        self.bad_evals = 0
        self.decays = 0
        self.history: List[Dict[str, float]] = []
        self.train_seconds = 0.0
        self.trained_words = 0
        self.resumed_from: Optional[str] = None
        self.best_params: Dict[str, np.ndarray] = {}
        self.best_state: Dict[str, np.ndarray] = {}
        self._stop = False

    def _read_target(self, vocab: Optional[Vocabulary] = None) -> None:
        """Target-only models: the compiled corpus of the training text (compiled on first use),
        its vocabulary (``vocab``, a continued model's, when given) and n-gram stream, and the
        held-out n-grams."""
        from nlmfeature.training.corpusfile import NgramStream, heldout_ngrams, open_corpus

        cfg = self.cfg
        t0 = time.time()
        corpus = open_corpus(cfg.train, cfg.corpus_dir or None,
                             progress=lambda n: self.log(f"compiling {cfg.train}: {n:,} tokens"))
        self.corpus = corpus
        if time.time() - t0 > 5:
            self.log(f"compiled corpus {corpus.path}: {corpus.tokens:,} tokens, "
                     f"{int(corpus.header['types']):,} word types [{time.time() - t0:.0f}s]")
        if vocab is not None:   # a continued model's vocabulary; the text's other words are <unk>
            self.vocab = vocab
            self.counts, remap = corpus.counts_in(vocab)
        else:
            self.vocab, self.counts, remap = corpus.vocabulary(cfg.min_count, cfg.max_vocab)
        self.data = NgramStream(corpus, remap, self.vocab.bos, cfg.order, cfg.reverse)
        if cfg.test_set:
            self.heldout, self.heldout_oov = heldout_ngrams(cfg.test_set, self.vocab, cfg.order, cfg.reverse,
                                                            cfg.corpus_dir or None)

    def _read_parallel(self, spec: ModelSpec) -> None:
        """Joint models: vocabularies and n-grams of the parallel training (and held-out) text."""
        from nlmfeature.core.joint import joint_ngrams, read_parallel

        cfg = self.cfg
        if not cfg.alignment:
            raise NLMFeatureError("a joint model (--source) needs the word alignment of the "
                                  "training text (--alignment, i-j pairs)")
        if bool(cfg.test_set) != bool(cfg.test_source and cfg.test_alignment):
            raise NLMFeatureError("a joint model's held-out set needs all three of --test-set, "
                                  "--test-source and --test-alignment")
        if cfg.direct_order:  # the default (3) included: joint models have none
            print(f"nlmfeature train: note: joint models have no direct n-gram features; "
                  f"--direct-order {cfg.direct_order} does not apply", file=sys.stderr)
        w = spec.source_window
        t2s = cfg.target_to_source  # then srcs are the target sentences, tgts the source's
        srcs, tgts, affs = read_parallel(cfg.source, cfg.train, cfg.alignment, target_to_source=t2s)
        self.vocab, self.counts = build_vocabulary(tgts, cfg.min_count, cfg.max_vocab)
        self.source_vocab, self.source_counts = build_vocabulary(srcs, cfg.min_count, cfg.max_vocab)
        self.data = joint_ngrams(srcs, tgts, affs, self.vocab, self.source_vocab, cfg.order, w)
        self.data.contexts[:, :w] += len(self.vocab)  # combined input table: source rows after target
        del srcs, tgts, affs
        if cfg.test_set:
            s2, t2, a2 = read_parallel(cfg.test_source, cfg.test_set, cfg.test_alignment,
                                       target_to_source=t2s)
            self.heldout = joint_ngrams(s2, t2, a2, self.vocab, self.source_vocab, cfg.order, w)
            self.heldout_oov = sum(1 for t in t2 for x in t if x not in self.vocab)

    # -- evaluation and writing ---------------------------------------------------------
    def model_arrays(self, tables: bool = False) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
        """(header, arrays) of the current parameters (the embeddings a copy)."""
        return export_arrays(self.header, self.template, self.params, self.vocab, tables)

    @contextlib.contextmanager
    def exported(self, tables: bool = False) -> Iterator[Tuple[Dict[str, Any], Dict[str, np.ndarray]]]:
        """(header, arrays) of the current parameters for the ``with`` block, copying nothing
        of the embeddings: their ``<null>`` row holds the model file's value inside the block
        and its trained value again after it."""
        emb = self.params.get("embeddings")
        keep = emb[self.vocab.null].copy() if emb is not None else None
        try:
            yield export_arrays(self.header, self.template, self.params, self.vocab, tables, own=True)
        finally:
            if keep is not None:
                emb[self.vocab.null] = keep

    def perplexity(self, data: Optional[NgramData] = None) -> float:
        """Held-out perplexity of the current parameters (scored by the scorer)."""
        data = data or self.heldout
        with self.exported() as (h, a):
            s = heldout_logprob(h, a, data)
        return float(math.exp(-s.sum() / len(s)))

    def write_model(self) -> str:
        """Write the current parameters to ``model_out`` (atomically); returns the checksum."""
        with self.exported(tables=self.cfg.tables) as (h, a):
            h["metadata"] = self._metadata()
            return modelfile.write_model(self.cfg.model_out, h, a)

    def _metadata(self) -> Dict[str, Any]:
        """What a written model records of its training."""
        m = {"trained_by": "nlmfeature train", "estimator": self.estimator,
             "epochs": round(self.epoch + self.batch / max(1, self.batches_per_epoch), 4),
             "heldout_perplexity": None if math.isinf(self.best) else self.best,
             "train": os.path.basename(self.cfg.train), "seed": self.cfg.seed,
             "noise_samples": self.cfg.noise_samples, "shared_noise": bool(self.cfg.shared_noise),
             "self_normalise": self.cfg.self_normalise,
             "reverse": bool(self.cfg.reverse)}
        if self.cfg.init_model:
            m["init_model"] = os.path.basename(self.cfg.init_model)
        if self.cfg.source:
            m.update({"source": os.path.basename(self.cfg.source),
                      "alignment": os.path.basename(self.cfg.alignment or ""),
                      "affiliation": "devlin2014",
                      "target_to_source": bool(self.cfg.target_to_source)})
        return m

    # -- checkpoints --------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Write everything needed to resume, atomically (no pickle)."""
        meta = {"version": CHECKPOINT_VERSION, "fingerprint": self.cfg.fingerprint(), "epoch": self.epoch,
                "batch": self.batch, "step": self.step, "best": self.best if not math.isinf(self.best) else None,
                "best_epoch": self.best_epoch, "bad_evals": self.bad_evals, "decays": self.decays, "history": self.history,
                "vocab_size": len(self.vocab), "train_seconds": self.train_seconds,
                "trained_words": self.trained_words, "lr": self.opt.lr}
        arrays = {"meta": np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)}
        for n, p in self.params.items():
            arrays["param/" + n] = p
            arrays["adagrad/" + n] = self.opt.state[n]
            if n in self.best_params:
                arrays["best_param/" + n] = self.best_params[n]
                arrays["best_adagrad/" + n] = self.best_state[n]
        _atomic_savez(checkpoint_path(self.cfg.model_out), arrays)

    def load_checkpoint(self, path: str) -> bool:
        """Resume from ``path`` if it belongs to this run; returns whether it did."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode("utf-8"))
                if meta.get("version") != CHECKPOINT_VERSION:
                    raise NLMFeatureError(f"{path}: checkpoint version {meta.get('version')} is not "
                                          f"{CHECKPOINT_VERSION}; delete it or pass --no-resume")
                if meta["fingerprint"] != self.cfg.fingerprint() or meta["vocab_size"] != len(self.vocab):
                    raise NLMFeatureError(
                        f"{path}: this checkpoint was written with other settings or data; "
                        "delete it, choose another --model-out, or pass --no-resume to start afresh")
                for n in self.params:
                    self.params[n][...] = z["param/" + n]
                    self.opt.state[n][...] = z["adagrad/" + n]
                    if "best_param/" + n in z.files:
                        self.best_params[n] = z["best_param/" + n]
                        self.best_state[n] = z["best_adagrad/" + n]
        except (OSError, ValueError, KeyError) as exc:
            raise NLMFeatureError(f"{path}: unreadable checkpoint ({exc}); delete it or pass --no-resume") from None
        self.epoch, self.batch, self.step = meta["epoch"], meta["batch"], meta["step"]
        self.best = math.inf if meta["best"] is None else meta["best"]
        self.best_epoch, self.bad_evals = meta["best_epoch"], meta["bad_evals"]
        self.decays = meta.get("decays", 0)
        self.history = meta["history"]
        self.train_seconds = meta.get("train_seconds", 0.0)
        self.trained_words = meta.get("trained_words", 0)
        self.opt.lr = meta.get("lr", self.opt.lr)
        self.resumed_from = path
        return True

    # -- the loop -----------------------------------------------------------------------
    @property
    def batches_per_epoch(self) -> int:
        return self.data.batches_per_epoch(self.cfg.minibatch_size)

    @property
    def eval_interval(self) -> int:
        """Minibatches between held-out evaluations inside an epoch (0: only at epoch ends)."""
        if self.heldout is None:
            return 0
        if self.cfg.eval_every:
            return self.cfg.eval_every
        e = self.cfg.evals_per_epoch   # the last of the e evaluations is the epoch end's
        return math.ceil(self.batches_per_epoch / e) if e > 1 and self.batches_per_epoch >= e else 0

    def _evaluate(self, tag: str) -> float:
        ep = self.epoch + self.batch / self.batches_per_epoch
        if self.heldout is None:
            self.write_model()
            self.history.append({"epoch": ep, "perplexity": float("nan")})
            return math.nan
        t0 = time.time()
        ppl = self.perplexity()
        self.history.append({"epoch": round(ep, 4), "perplexity": ppl})
        improved = ppl < self.best
        note = ""
        if improved:
            self.best, self.best_epoch, self.bad_evals = ppl, round(ep, 4), 0
            self.write_model()
            if self.cfg.lr_decay < 1:
                self._keep_best()
        else:
            self.bad_evals += 1
            if (self.cfg.patience and self.bad_evals >= self.cfg.patience and self.cfg.lr_decay < 1
                    and self.decays < self.cfg.max_decays and self.best_params):
                # newbob: only when the held-out perplexity has stalled (--patience evaluations
                # in a row), not at the first noisy evaluation
                self._restore_best()
                self.opt.lr *= self.cfg.lr_decay
                self.decays += 1
                self.bad_evals = 0
                note = (f"; {self.cfg.patience} evaluations without improvement: back to the best "
                        f"parameters, step size now {self.opt.lr:.3g} (decay {self.decays}/{self.cfg.max_decays})")
        raw = " (raw scores: unnormalised)" if self.header["output"]["type"] == "unnormalised" else ""
        self.log(f"{tag}: epoch {ep:.2f}  held-out perplexity{raw} {ppl:.2f}"
                 f"{'  (best: model written)' if improved else f'  (best {self.best:.2f}{note})'}"
                 f"  [{time.time() - t0:.1f}s]")
        return ppl

    def fused(self) -> bool:
        """Whether minibatches take the fused native step (:func:`nlmfeature._train.nce_lbl_step`):
        the default recipe's architecture, a diagonal log-bilinear model trained by NCE, without
        dropout.  Other models take the general numpy path (:class:`Objective` + :class:`AdaGrad`)."""
        h = self.header
        br = h["branches"]
        return (self.estimator == "nce" and len(br) == 1 and br[0]["diagonal"] and br[0]["activation"] == "identity"
                and not h["layers"] and not self.cfg.dropout and h["order"] > 1
                and all(p.dtype == np.float32 for p in self.params.values()))

    def _keep_best(self) -> None:
        """Remember the parameters and AdaGrad sums of the best evaluation (--lr-decay)."""
        for n, p in self.params.items():
            if n not in self.best_params:
                self.best_params[n] = np.empty_like(p)
                self.best_state[n] = np.empty_like(self.opt.state[n])
            np.copyto(self.best_params[n], p)
            np.copyto(self.best_state[n], self.opt.state[n])

    def _restore_best(self) -> None:
        for n, p in self.params.items():
            np.copyto(p, self.best_params[n])
            np.copyto(self.opt.state[n], self.best_state[n])

    def _interrupt(self, signum, frame) -> None:  # pragma: no cover - signal path
        if self._stop:
            raise KeyboardInterrupt
        self._stop = True
        self.log("interrupted: finishing this minibatch and writing a checkpoint (Ctrl-C again to abort)")

    # -- hooks of the loop (another engine overrides them: nlmfeature.training.torch_engine) --
    #: whether this process writes the model and checkpoints (one of several ranks may not)
    writes = True
    #: how the run's log line names the engine ("" for the native one)
    engine_note = ""

    def noise_and_mask(self, targets: np.ndarray) -> Tuple[Any, Optional[np.ndarray]]:
        """(NCE noise or None, dropout mask or None) of the current minibatch: functions of the
        seed and the minibatch number only."""
        cfg = self.cfg
        if self.noise is None:
            noise = None
        elif cfg.shared_noise:
            noise = self.noise.draw_shared(cfg.seed, self.step)
        else:
            noise = self.noise.draw(targets, cfg.seed, self.step, self.kernel_threads)
        mask = dropout_mask((len(targets), self.header["output"]["dim"]), cfg.dropout, cfg.seed,
                            self.step) if cfg.dropout else None
        return noise, mask

    @property
    def hogwild_threads(self) -> int:
        """Minibatches trained at once, one per thread, without locks (Hogwild!, Recht et al.
        2011): ``--threads`` for the fused step with per-word noise unless ``--no-hogwild``, else
        1 (the threads then share each minibatch)."""
        cfg = self.cfg
        return cfg.threads if self._fused and cfg.hogwild and not cfg.shared_noise and cfg.threads > 1 else 1

    def _fused_args(self) -> Tuple[List[np.ndarray], List[np.ndarray]]:
        """The parameters and their AdaGrad sums in the fused kernels' order (an empty array
        for one the model lacks)."""
        e32 = np.zeros(0, dtype=np.float32)
        names = ["embeddings", "branch0.weights", "branch0.bias", "output.weight", "output.bias"]
        if not self.cfg.shared_noise:
            names.append("direct.weights")
        return [self.params.get(n, e32) for n in names], [self.opt.state.get(n, e32) for n in names]

    def _direct_args(self) -> Tuple[int, int, np.ndarray]:
        """The fused kernels' direct-feature arguments: the order (0: none), the hash space and
        the filter's bitmap."""
        spec = self.objective.out.s
        return (spec.direct_order if "direct.weights" in self.params else 0, max(1, spec.hash_space),
                self._allowed_bits)

    def _fused_step(self, ctx: np.ndarray, targets: np.ndarray, noise: Any, l2: float) -> float:
        """The fused native step on one minibatch (:func:`nlmfeature._train.nce_lbl_step`)."""
        from nlmfeature import _train

        ps, sums = self._fused_args()
        spec = self.objective.out.s
        ctx32 = np.ascontiguousarray(ctx, dtype=np.int32)
        t32 = np.ascontiguousarray(targets, dtype=np.int32)
        lr, eps, kt = self.opt.lr, self.opt.eps, self.kernel_threads
        if self.cfg.shared_noise:
            return _train.nce_lbl_shared_step(*ps, *sums, ctx32, t32, noise.words, spec.logq, lr, l2, eps, kt)
        return _train.nce_lbl_step(*ps, *sums, ctx32, t32, noise.words, spec.logq, *self._direct_args(),
                                   lr, l2, eps, kt)

    def train_step(self, ctx: np.ndarray, targets: np.ndarray, l2: float) -> float:
        """One AdaGrad update on a minibatch (the fused native step when :meth:`fused`);
        returns its summed loss."""
        noise, mask = self.noise_and_mask(targets)
        if self._fused:
            return self._fused_step(ctx, targets, noise, l2)
        loss = self.objective.loss_and_grads(ctx, targets, noise, self.grads, mask)
        if math.isfinite(loss):
            self.opt.step(self.grads, l2=l2)
        return loss

    def train_round(self, batches: List[Tuple[np.ndarray, np.ndarray]], l2: float) -> List[float]:
        """Train the minibatches ``batches`` (numbers ``step``, ``step + 1``, ...): one at a time
        (:meth:`train_step`), or, with :attr:`hogwild_threads` > 1, all at once, each on a thread
        of its own, reading and updating the shared parameters without locks
        (:func:`nlmfeature._train.nce_lbl_rounds`).  Returns their summed losses."""
        if len(batches) == 1:
            return [self.train_step(batches[0][0], batches[0][1], l2)]
        from nlmfeature import _train

        ps, sums = self._fused_args()
        bounds = np.cumsum([0] + [len(t) for _, t in batches]).astype(np.int64)
        # each thread draws its minibatch's noise, as noise_and_mask would
        noise = self.noise.kernel_args(self.cfg.seed, [self.step + i for i in range(len(batches))])
        losses = _train.nce_lbl_rounds(
            *ps, *sums, np.ascontiguousarray(np.concatenate([c for c, _ in batches]), dtype=np.int32),
            np.ascontiguousarray(np.concatenate([t for _, t in batches]), dtype=np.int32), bounds, *noise,
            self.objective.out.s.logq, *self._direct_args(), self.opt.lr, l2, self.opt.eps)
        return [float(x) for x in losses]

    def _round_size(self, nb: int, every: int, updates: int) -> int:
        """Minibatches in the next round: :attr:`hogwild_threads`, fewer where the epoch, an
        evaluation or the update limit comes sooner."""
        k = min(self.hogwild_threads, nb - self.batch)
        if every:
            k = min(k, every - self.batch % every)
        if self.cfg.max_updates:
            k = min(k, self.cfg.max_updates - updates)
        return max(1, k)

    def _agree(self, flags: List[float]) -> List[float]:
        """Each flag as all the processes of the run see it (their maximum); one process: itself."""
        return flags

    def _synchronise(self) -> None:
        """Make every process's parameters and position the writer's (after resuming)."""

    def _barrier(self) -> None:
        """Wait for every process of the run."""

    def run(self) -> TrainResult:
        """Train (resuming if a matching checkpoint exists) and return the result."""
        cfg = self.cfg
        set_blas_threads(max(1, cfg.threads))
        ck = checkpoint_path(cfg.model_out)
        if self.writes and cfg.resume and os.path.exists(ck):
            self.load_checkpoint(ck)
            self.log(f"resuming from {ck}: epoch {self.epoch}, minibatch {self.batch}")
        elif self.writes and not cfg.resume and os.path.exists(ck):
            os.unlink(ck)
        self._synchronise()
        N, B = len(self.data), cfg.minibatch_size
        nb = self.batches_per_epoch
        l2 = cfg.lambda_lbl * B / N
        if self.heldout is None:
            self.log(f"warning: no --test-set, so no early stopping: all {cfg.iterations} epochs run and the "
                     "last is kept (it may over-fit; a held-out text picks the best evaluation)")
        self.log(f"training {self.estimator} on {N} n-grams ({len(self.vocab)} words, "
                 f"{int(self.counts[self.vocab.unk])} <unk> tokens){self.engine_note}, {cfg.iterations} epochs "
                 f"of {nb} minibatches")
        old_handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                old_handlers[sig] = signal.signal(sig, self._interrupt)
            except ValueError:  # not the main thread
                pass
        every = self.eval_interval
        deadline = time.time() + cfg.max_minutes * 60 if cfg.max_minutes else math.inf
        last_ck = time.time()
        updates = 0
        bar = None
        try:
            from nlmfeature.io.progress import progress

            stop_reason = ""
            while self.epoch < cfg.iterations and not stop_reason:
                feed = self.data.batches(self.epoch, cfg.seed, B, self.batch)
                bar = progress(total=nb, initial=self.batch, desc=f"epoch {self.epoch + 1}/{cfg.iterations}",
                               unit="batch", enabled=cfg.progress and self.writes, leave=False)
                t_epoch, w_epoch = time.time(), 0
                pending: List[Tuple[np.ndarray, float]] = []   # a round's trained minibatches, to count
                while self.batch < nb:
                    t0 = time.time()
                    if not pending:
                        rnd = [next(feed) for _ in range(self._round_size(nb, every, updates))]
                        pending = [(tg, loss) for (_, tg), loss in zip(rnd, self.train_round(rnd, l2))]
                    tg, loss = pending.pop(0)
                    # every process stops together: Ctrl-C, divergence, the time limit, checkpoints
                    ck_due = cfg.checkpoint_minutes and time.time() - last_ck > cfg.checkpoint_minutes * 60
                    stop, bad, late, ck_now = self._agree([float(self._stop), float(not math.isfinite(loss)),
                                                           float(time.time() > deadline), float(bool(ck_due))])
                    if bad:
                        raise NLMFeatureError(f"training diverged (loss {loss}) at epoch {self.epoch + 1}, "
                                              f"minibatch {self.batch}: lower --step-size")
                    self.train_seconds += time.time() - t0
                    self.trained_words += len(tg)
                    w_epoch += len(tg)
                    self.batch += 1
                    self.step += 1
                    bar.update(1)
                    if self.batch % 20 == 0 or self.batch == nb:
                        post = {"loss/word": f"{loss / len(tg):.3f}",
                                "words/s": f"{w_epoch / max(1e-9, time.time() - t_epoch):.0f}"}
                        if self.history and not math.isinf(self.best):
                            post["held-out ppl"] = f"{self.history[-1]['perplexity']:.1f}"
                        bar.set_postfix(post, refresh=False)
                    if every and self.batch % every == 0 and self.batch < nb:
                        self._evaluate("minibatch")
                        self.save_checkpoint()
                        last_ck = time.time()
                        if cfg.patience and self.bad_evals >= cfg.patience:
                            stop_reason = "no improvement"
                            break
                    updates += 1
                    if pending:   # a round stops, checkpoints and evaluates as a whole
                        continue
                    if stop:
                        self._stop = True
                        stop_reason = "interrupted"
                        break
                    if cfg.max_updates and updates >= cfg.max_updates:
                        stop_reason = "update limit"
                        break
                    if late:
                        stop_reason = "time limit"
                        break
                    if ck_now:
                        self.save_checkpoint()
                        last_ck = time.time()
                bar.close()
                if self.batch >= nb:
                    self.epoch += 1
                    self.batch = 0
                    self._evaluate(f"epoch {self.epoch}")
                    if cfg.patience and self.bad_evals >= cfg.patience:
                        stop_reason = "no improvement"
                self.save_checkpoint()
                last_ck = time.time()
            if stop_reason in ("interrupted", "update limit"):
                self.log(f"checkpoint written to {ck}; run the same command again to resume")
            elif stop_reason:
                self.log(f"stopped: {stop_reason}")
                if stop_reason == "time limit" and self.heldout is not None and self.batch:
                    self._evaluate("time limit")
            if self.writes:
                if not os.path.exists(cfg.model_out):
                    self.write_model()
                if stop_reason == "time limit":
                    self.save_checkpoint()
                    self.log(f"checkpoint written to {ck}; run the same command again to train on")
                elif stop_reason not in ("interrupted", "update limit") and os.path.exists(ck):
                    os.unlink(ck)   # a finished run: nothing left to resume
            self._barrier()
        finally:
            if bar is not None:
                bar.close()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
        if stop_reason == "interrupted":
            raise TrainingInterrupted(f"checkpoint written to {ck}; run the same command again to resume")
        ep = self.epoch + self.batch / nb
        return TrainResult(model_out=cfg.model_out, best_perplexity=self.best, best_epoch=self.best_epoch,
                           epochs=round(ep, 4), words_per_second=self.trained_words / max(1e-9, self.train_seconds),
                           history=self.history, vocab_size=len(self.vocab), train_tokens=len(self.data),
                           estimator=self.estimator, resumed_from=self.resumed_from,
                           trained_words=self.trained_words, train_seconds=self.train_seconds)


def train(cfg: TrainConfig, log: Callable[[str], None] = None) -> TrainResult:
    """Train a model as ``cfg`` says (see :class:`TrainConfig`).  The outputs (the model and
    its checkpoint) are checked before the corpus is read and the work starts."""
    if cfg.model_out:
        check_output(cfg.model_out, "--model-out")
        check_output(checkpoint_path(cfg.model_out), "checkpoint")
    return Trainer(cfg, log).run()


__all__ = ["TrainConfig", "TrainResult", "Trainer", "TrainingInterrupted", "train", "export_arrays", "heldout_logprob",
           "checkpoint_path", "InputError"]
