"""KenLM baseline: train a modified Kneser-Ney n-gram model with ``lmplz``, score text with the
``kenlm`` Python module, and interpolate it with a neural model.

Build the tools once with ``tools/build_kenlm.sh`` in a source checkout (lmplz, build_binary and query from the
PyPI ``kenlm`` source distribution, plus the ``kenlm`` module).

**Counting tokens and OOVs** exactly as :meth:`nlmfeature.core.model.Model.perplexity` does: every
word of a sentence and one ``</s>`` per sentence are predicted, each after ``<s>`` and the
words before it; a word outside the *neural model's* vocabulary (or the literal ``<unk>``) is
an OOV.  OOVs are scored as the unknown word by both models and counted, unless
``exclude_oov``, which skips the same tokens for every model (SRILM's convention; ``</s>`` is
always counted).  So both models predict the same events: the neural vocabulary, with all
other words merged into one ``<unk>`` event.  :func:`train_kenlm` given the neural vocabulary
makes KenLM model that same event space: it rewrites every word outside the vocabulary as
:data:`UNK_TOKEN` (``lmplz`` refuses a literal ``<unk>`` in its input) and the scorer maps the
neural OOVs to that token, so KenLM's probability of the unknown word is estimated from the
training text as the neural model's is.  A KenLM model trained otherwise still works: OOVs are
then scored as KenLM's own ``<unk>`` (usually a tiny probability, which flatters nobody), and
the table reports how many tokens KenLM did not know.

**Interpolation** (weight ``w`` of the neural model, tuned on validation tokens):

* linear: ``p = w p_nlm + (1 - w) p_kenlm`` (a distribution if both are);
* log-linear: ``p = p_nlm^w p_kenlm^(1-w) / Z_w(h)``, normalised *exactly*: ``Z_w(h)`` sums over
  every word the models predict (the vocabulary without ``<s>`` and ``<null>``), with the
  neural model's whole output distribution from its matrix-product scorer and KenLM's whole
  distribution rebuilt from the ARPA file (backoff: each word's probability is that of its
  longest known n-gram times the backoff weights of the longer contexts).  It therefore needs
  the ARPA file (not a KenLM binary) and a model without direct n-gram features.  Because
  the sum costs a pass over the vocabulary per token, the weight is tuned on at most
  ``tune_tokens`` validation tokens (evenly spaced); the test set is evaluated in full.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np

from nlmfeature.io.atomicfile import check_output, install
from nlmfeature.io.textio import iter_lines, read_head, split_tokens
from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.core.forward import vocab_log_scores
from nlmfeature.core.model import exactly_normalised
from nlmfeature.core.vocab import Vocabulary

#: what words outside the neural vocabulary become in KenLM's training text and queries
UNK_TOKEN = "<nlmfeature-unk>"
LN10 = math.log(10.0)
#: KenLM's log10 probability of ``<unk>`` when the ARPA file has none
MISSING_UNK_LOG10 = -99.0
#: warn when KenLM does not know more than this fraction of the test tokens the neural model knows
VOCAB_MISMATCH_WARN = 0.05
DEFAULT_BIN = os.path.join(os.path.expanduser("~"), ".cache", "nlmfeature", "kenlm", "bin")


# ---------------------------------------------------------------------------------------
# tools
# ---------------------------------------------------------------------------------------
def find_tool(name: str, dirs: Sequence[Optional[str]] = ()) -> str:
    """Path of a KenLM tool (``lmplz``, ``build_binary``, ``query``): in ``dirs`` (given
    folders; None entries skipped), $NLMFEATURE_KENLM_BIN, then
    ~/.cache/nlmfeature/kenlm/bin, then $PATH.  Raises :class:`NLMFeatureError` saying how
    to build it."""
    for d in list(dirs) + [os.environ.get("NLMFEATURE_KENLM_BIN"), DEFAULT_BIN]:
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    found = shutil.which(name)
    if found:
        return found
    raise NLMFeatureError(f"KenLM's {name} was not found: {build_hint()}")


#: the build script of a source checkout, relative to its root
BUILD_SCRIPT = os.path.join("tools", "build_kenlm.sh")


def build_hint(checkout: Optional[str] = None) -> str:
    """How to get KenLM's tools: the checkout's build script when the package runs from a
    source checkout (``checkout``: its root, by default the one around this package), else
    (an install from a wheel) the upstream build and the folders searched."""
    if checkout is None:
        checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
    script = os.path.join(checkout, BUILD_SCRIPT)
    if os.path.isfile(script):
        return f"run `bash {script}` (it builds lmplz, build_binary and query into {DEFAULT_BIN})"
    return ("build KenLM from https://github.com/kpu/kenlm (cmake; `make lmplz build_binary "
            f"query`) and put its bin folder on PATH, in {DEFAULT_BIN} or in "
            "NLMFEATURE_KENLM_BIN")


def import_kenlm():
    """The ``kenlm`` Python module, or :class:`NLMFeatureError` saying how to install it."""
    try:
        import kenlm  # type: ignore
    except ImportError:
        raise NLMFeatureError("the Python kenlm module is not installed: run "
                              "`pip install kenlm`") from None
    return kenlm


def is_arpa(path: str) -> bool:
    """Whether a KenLM model file is an ARPA text file (rather than a KenLM binary)."""
    return b"\\data\\" in read_head(path, 4096)


def map_oov(tokens: Sequence[str], vocab: Optional[Vocabulary], unk: str = UNK_TOKEN) -> List[str]:
    """Tokens with every word outside ``vocab`` (and a literal ``<unk>``) replaced by ``unk``."""
    if vocab is None:
        return list(tokens)
    return [t if (t in vocab and t != "<unk>") else unk for t in tokens]


#: highest n-gram order the kenlm module (and so the scorer of a --kenlm-train model) loads:
#: its KENLM_MAX_ORDER build setting
KENLM_MAX_ORDER = 6


def train_kenlm(text: str, out: str, order: int = 5, vocab: Optional[Vocabulary] = None,
                memory: str = "1G", binary: Optional[str] = None,
                extra_args: Sequence[str] = ()) -> str:
    """Estimate a modified Kneser-Ney ``order``-gram ARPA model of ``text`` with ``lmplz``.

    With ``vocab`` (the neural model's vocabulary), words outside it become
    :data:`UNK_TOKEN` first, so both models predict the same events.  ``memory`` is lmplz's
    ``-S``; ``--discount_fallback`` is always passed (small texts lack the count-of-counts
    modified Kneser-Ney needs).  ``binary``, if given, also writes a KenLM binary there.
    Files are written atomically.  Returns ``out``.
    """
    for path, what in ((out, "ARPA output"), (binary, "KenLM binary output")):
        if path:
            check_output(path, what)    # before lmplz runs
    lmplz = find_tool("lmplz")
    out_dir = os.path.dirname(os.path.abspath(out))
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".kenlm.") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as dst:
            for lineno, line in iter_lines(text):
                toks = split_tokens(line)
                bad = [t for t in toks if t in ("<s>", "</s>")]
                if bad:
                    raise InputError(text, lineno, f"the training text contains {bad[0]!r}, "
                                     "which KenLM reserves; remove sentence markers")
                dst.write(" ".join(map_oov(toks, vocab)) + "\n")
        arpa_tmp = os.path.join(tmp, "model.arpa")
        cmd = [lmplz, "-o", str(order), "-S", memory, "-T", tmp, "--discount_fallback",
               "--text", corpus, "--arpa", arpa_tmp, *extra_args]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise NLMFeatureError(f"lmplz failed on {text} (exit {proc.returncode}):\n"
                                  + "\n".join(proc.stderr.strip().splitlines()[-5:]))
        if binary:
            bin_tmp = os.path.join(tmp, "model.bin")
            proc = subprocess.run([find_tool("build_binary"), arpa_tmp, bin_tmp],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                raise NLMFeatureError("build_binary failed:\n" + proc.stderr[-2000:])
            install(bin_tmp, binary)
        install(arpa_tmp, out)
    return out


# ---------------------------------------------------------------------------------------
# per-token scores
# ---------------------------------------------------------------------------------------
@dataclass
class TokenScores:
    """Natural-log scores of every predicted token of a text, in order, with its OOV flags."""

    logprob: np.ndarray        #: (N,) float64
    oov: np.ndarray            #: (N,) bool: word outside the neural vocabulary (never </s>)
    sentences: int

    def total(self, exclude_oov: bool = False) -> Tuple[float, int]:
        """(sum of log-probabilities, counted tokens)."""
        keep = ~self.oov if exclude_oov else slice(None)
        lp = self.logprob[keep]
        return float(lp.sum()), int(lp.size)


def perplexity(logprob: np.ndarray) -> float:
    """exp(-mean natural-log probability)."""
    return float(math.exp(-float(np.mean(logprob)))) if len(logprob) else float("nan")


def oov_mask(sentences: Sequence[Sequence[str]], vocab: Vocabulary) -> np.ndarray:
    """OOV flag of every predicted token (words, then ``</s>`` which is never OOV)."""
    flags: List[bool] = []
    for toks in sentences:
        flags.extend(t not in vocab or t == "<unk>" for t in toks)
        flags.append(False)
    return np.asarray(flags, dtype=bool)


def nlm_token_scores(model, sentences: Sequence[Sequence[str]], batch: int = 8192,
                     exact: bool = False) -> TokenScores:
    """The neural model's score of every token (as :meth:`Model.perplexity` counts them).
    ``exact``: an unnormalised model's scores are renormalised exactly (see
    :func:`exactly_normalised`) instead of taken raw."""
    scorer = exactly_normalised(model) if exact else model
    ctx, words = nlm_ngrams(model, sentences)
    out = np.empty(len(words), dtype=np.float64)
    for s in range(0, len(words), batch):
        out[s:s + batch] = scorer.score_batch(ctx[s:s + batch], words[s:s + batch])
    return TokenScores(out, oov_mask(sentences, model.vocab), len(sentences))


def nlm_ngrams(model, sentences: Sequence[Sequence[str]]) -> Tuple[np.ndarray, np.ndarray]:
    """Padded contexts (N, n-1) and target ids (N,) of every predicted token."""
    cs, ws = [], []
    for toks in sentences:
        c, w = model.sentence_ngrams(toks)
        cs.append(c); ws.append(w)
    if not cs:
        return np.zeros((0, model.order - 1), dtype=np.int32), np.zeros(0, dtype=np.int32)
    return np.concatenate(cs), np.concatenate(ws)


class KenLMScorer:
    """A KenLM model (ARPA or binary) queried through the ``kenlm`` module with the neural
    model's token and OOV conventions (see the module docstring)."""

    def __init__(self, path: str, vocab: Optional[Vocabulary] = None) -> None:
        kenlm = import_kenlm()
        if not os.path.exists(path):
            raise NLMFeatureError(f"{path}: no such KenLM model file")
        try:
            self.model = kenlm.Model(path)
        except Exception as exc:  # kenlm raises OSError/RuntimeError with its own message
            raise NLMFeatureError(f"{path}: KenLM cannot load it: {exc}") from None
        self.path = path
        self.vocab = vocab
        self.order = int(self.model.order)
        self.unk_token = UNK_TOKEN if UNK_TOKEN in self.model else "<unk>"
        #: the file has no ``<unk>`` entry: KenLM then gives every word it does not know
        #: log10 probability -100 (and says so on stderr), which makes perplexities meaningless
        self.missing_unk = self.model.score("<unk>", bos=False, eos=False) <= MISSING_UNK_LOG10

    def unknown_known_words(self, sentences: Sequence[Sequence[str]]) -> Tuple[int, int]:
        """(tokens KenLM does not know among those the neural vocabulary knows, tokens the
        neural vocabulary knows): a high ratio means the two models were built for different
        vocabularies (other text, tokenisation or casing)."""
        known = unknown = 0
        vocab, model = self.vocab, self.model
        for toks in sentences:
            for t in toks:
                if vocab is None or (t in vocab and t != "<unk>"):
                    known += 1
                    unknown += t not in model
        return unknown, known

    def query_tokens(self, toks: Sequence[str]) -> List[str]:
        """The words KenLM is asked about for a sentence (neural OOVs -> the unknown token)."""
        return map_oov(toks, self.vocab, self.unk_token)

    def token_scores(self, sentences: Sequence[Sequence[str]]) -> Tuple[TokenScores, int]:
        """(scores of every token, number of tokens KenLM itself had no n-gram for)."""
        lps: List[float] = []
        kenlm_oov = 0
        for toks in sentences:
            q = self.query_tokens(toks)
            for lp, _, is_oov in self.model.full_scores(" ".join(q), bos=True, eos=True):
                lps.append(lp * LN10)
                kenlm_oov += bool(is_oov)
        mask = oov_mask(sentences, self.vocab) if self.vocab is not None else \
            np.zeros(len(lps), dtype=bool)
        return TokenScores(np.asarray(lps, dtype=np.float64), mask, len(sentences)), kenlm_oov

    def sentence_logprobs(self, sentences: Sequence[Sequence[str]]) -> List[float]:
        """Natural-log probability of each whole sentence (``<s>`` context, ``</s>`` scored):
        what Moses' KenLM feature adds for a complete hypothesis (its ``LM0=`` value)."""
        score = self.model.score
        return [score(" ".join(self.query_tokens(toks)), bos=True, eos=True) * LN10
                for toks in sentences]

    def histories(self, sentences: Sequence[Sequence[str]]) -> List[Tuple[str, ...]]:
        """KenLM's history (up to order-1 query words, oldest first, from ``<s>``) of every
        predicted token."""
        out: List[Tuple[str, ...]] = []
        n = self.order - 1
        for toks in sentences:
            hist = ["<s>"] + self.query_tokens(toks)
            for i in range(1, len(hist) + 1):
                out.append(tuple(hist[max(0, i - n):i]))
        return out


# ---------------------------------------------------------------------------------------
# interpolation
# ---------------------------------------------------------------------------------------
def linear_logprob(nlm: np.ndarray, kenlm: np.ndarray, weight: float) -> np.ndarray:
    """log(w exp(nlm) + (1-w) exp(kenlm)) per token (natural logs): the two-model case of
    :func:`mixture_logprob`."""
    return mixture_logprob(np.stack([nlm, kenlm]), [weight, 1.0 - weight])


def tune_linear(nlm: np.ndarray, kenlm: np.ndarray) -> float:
    """Weight of the neural model maximising the likelihood of the (validation) tokens under
    linear interpolation: the two-model case of :func:`tune_mixture`."""
    return float(tune_mixture(np.stack([nlm, kenlm]))[0])


def interpolate(nlm_token_logprobs: np.ndarray, kenlm_token_logprobs: np.ndarray,
                valid_nlm: Optional[np.ndarray] = None, valid_kenlm: Optional[np.ndarray] = None,
                weight: Optional[float] = None) -> Tuple[np.ndarray, float]:
    """Linear interpolation of per-token natural-log probabilities: (interpolated scores,
    neural weight).  The weight is ``weight`` if given, else tuned on the validation scores
    (``valid_*``), else on the scores themselves."""
    if weight is None:
        vn = nlm_token_logprobs if valid_nlm is None else valid_nlm
        vk = kenlm_token_logprobs if valid_kenlm is None else valid_kenlm
        weight = tune_linear(vn, vk)
    return linear_logprob(nlm_token_logprobs, kenlm_token_logprobs, weight), weight


def mixture_logprob(components: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """log(sum_j weights[j] exp(components[j])) per token: the token-level linear mixture of
    several models' natural-log scores, ``components`` (K, N)."""
    w = np.asarray(weights, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.logaddexp.reduce(np.log(w)[:, None] + np.asarray(components, dtype=np.float64), axis=0)


def tune_mixture(components: np.ndarray, iterations: int = 500, tol: float = 1e-10) -> np.ndarray:
    """Weights (K,) of the token-level linear mixture of K models that maximise the likelihood
    of the (validation) tokens whose natural-log scores are ``components`` (K, N), by EM (the
    objective is concave in the weights, so EM reaches the optimum; stops when the mean
    log-probability gains less than ``tol``)."""
    L = np.asarray(components, dtype=np.float64)
    if L.ndim != 2 or L.shape[0] < 1 or L.shape[1] < 1:
        raise ValueError("tune_mixture needs scores of shape (models, tokens), both >= 1")
    w = np.full(L.shape[0], 1.0 / L.shape[0])
    last = -math.inf
    for _ in range(iterations):
        joint = np.log(w)[:, None] + L
        total = np.logaddexp.reduce(joint, axis=0)
        w = np.exp(joint - total).mean(axis=1)
        mean = float(total.mean())
        if mean - last < tol:
            break
        last = mean
    return w / w.sum()


# ---------------------------------------------------------------------------------------
# exact log-linear interpolation
# ---------------------------------------------------------------------------------------
def nlm_log_scores(model, ctx: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The neural model's scores of *every* vocabulary word after each padded context, as
    (raw (N, V) float32, offset (N,) float64) with ``log p(w | ctx_i) = raw[i, w] - offset[i]``
    (natural logs): :func:`nlmfeature.core.forward.vocab_log_scores` of the model's hidden vectors.
    Models with direct n-gram features are not supported."""
    try:
        return vocab_log_scores(model.header, model.float32_arrays(), model.hidden(ctx))
    except ValueError as exc:
        raise NLMFeatureError(f"{model.path}: {exc}") from None


def nlm_log_distribution(model, ctx: np.ndarray) -> np.ndarray:
    """The neural model's natural-log score of every vocabulary word after each padded
    context: (N, V) float64 (see :func:`nlm_log_scores`)."""
    raw, offset = nlm_log_scores(model, ctx)
    return raw.astype(np.float64) - offset[:, None]


class ArpaDistribution:
    """KenLM's whole next-word distribution over the neural vocabulary for given histories,
    rebuilt from an ARPA file.  Only n-grams whose context is one of the requested histories
    (or their suffixes) are kept in memory."""

    def __init__(self, path: str, vocab: Vocabulary, histories: Iterable[Tuple[str, ...]],
                 unk_token: str) -> None:
        self.vocab = vocab
        V = len(vocab)
        self.V = V
        # query word -> neural id (the KenLM unknown word and foreign words get none)
        needed: Set[Tuple[str, ...]] = set()
        for h in histories:
            for j in range(1, len(h) + 1):
                needed.add(h[len(h) - j:])
        self.uni = None
        self.bo: Dict[Tuple[str, ...], float] = {}
        self.cont: Dict[Tuple[str, ...], Tuple[List[int], List[float]]] = {}
        uni = np.full(V, np.nan)
        unk_lp = None
        to_id: Dict[str, int] = {w: i for i, w in enumerate(vocab)}
        to_id[unk_token] = vocab.unk
        if unk_token != "<unk>":
            to_id.pop("<unk>", None)
        order = 0
        for lineno, line in iter_lines(path):     # the ARPA file
            line = line.strip()
            if not line:
                continue
            if line.startswith("\\"):
                if line.endswith("-grams:"):
                    try:
                        order = int(line[1:line.index("-")])
                    except ValueError:
                        raise InputError(path, lineno, f"bad ARPA section header {line[:40]!r}"
                                         ) from None
                elif line == "\\end\\":
                    break
                continue
            if order == 0:
                continue
            parts = line.split("\t")
            if len(parts) < 2:
                raise InputError(path, lineno, "not an ARPA n-gram line "
                                 "(log10prob<TAB>n-gram[<TAB>backoff])")
            try:
                lp = float(parts[0])
                bo = float(parts[2]) if len(parts) > 2 else 0.0
            except ValueError:
                raise InputError(path, lineno, "an ARPA probability or backoff weight is not a "
                                 "number") from None
            words = tuple(parts[1].split(" "))
            if order == 1:
                w = words[0]
                if w == "<unk>":
                    unk_lp = lp
                i = to_id.get(w)
                if i is not None:
                    uni[i] = lp
                if bo and words in needed:
                    self.bo[words] = bo
                continue
            if bo and words in needed:
                self.bo[words] = bo
            ctx = words[:-1]
            if ctx in needed:
                i = to_id.get(words[-1])
                if i is not None:
                    ids, lps = self.cont.setdefault(ctx, ([], []))
                    ids.append(i); lps.append(lp)
        if order == 0:
            raise NLMFeatureError(f"{path}: not an ARPA file (KenLM binaries cannot be read "
                                  "here: pass the ARPA file for log-linear interpolation)")
        if unk_lp is None:
            unk_lp = -100.0
        uni[np.isnan(uni)] = unk_lp           # words KenLM does not know get <unk>'s probability
        self.uni = uni
        self.cont_arrays = {k: (np.asarray(v[0], dtype=np.int64), np.asarray(v[1]))
                            for k, v in self.cont.items()}
        del self.cont

    def log10_rows(self, histories: Sequence[Tuple[str, ...]], scale: float = 1.0) -> np.ndarray:
        """(N, V) float32 log10 probabilities (times ``scale``) of every vocabulary word after
        each history."""
        out = np.empty((len(histories), self.V), dtype=np.float32)
        uni = (self.uni * scale).astype(np.float32)
        for r, h in enumerate(histories):
            n = len(h)
            bos = [self.bo.get(h[n - j:], 0.0) for j in range(1, n + 1)]   # bo(h_1..h_n)
            tail = np.cumsum(bos[::-1])[::-1] if bos else []                # tail[j-1] = sum_{i>=j} bo(h_i)
            row = out[r]
            np.add(uni, np.float32(tail[0] * scale) if n else np.float32(0.0), out=row)
            for j in range(1, n + 1):
                c = self.cont_arrays.get(h[n - j:])
                if c is None:
                    continue
                add = tail[j] if j < n else 0.0
                row[c[0]] = (c[1] + add) * scale
        return out


class LogLinear:
    """Exact log-linear interpolation of a neural model and a KenLM ARPA model over the
    neural vocabulary (see the module docstring)."""

    def __init__(self, model, arpa: str, scorer: KenLMScorer,
                 sentences_list: Sequence[Sequence[Sequence[str]]], chunk: int = 64) -> None:
        self.model = model
        self.scorer = scorer
        self.chunk = chunk
        hist: List[Tuple[str, ...]] = []
        for sents in sentences_list:
            hist.extend(scorer.histories(sents))
        if not is_arpa(arpa):
            raise NLMFeatureError(f"{arpa}: exact log-linear interpolation needs the ARPA file "
                                  "(this looks like a KenLM binary); pass the ARPA model or "
                                  "--no-loglinear")
        self.dist = ArpaDistribution(arpa, model.vocab, hist, scorer.unk_token)
        V = len(model.vocab)
        self.predictable = np.ones(V, dtype=bool)
        self.predictable[[model.vocab.bos, model.vocab.null]] = False

    def log_normalisers(self, ctx: np.ndarray, histories: Sequence[Tuple[str, ...]],
                        weights: Sequence[float], progress=None) -> np.ndarray:
        """log Z_w per token for each weight: (len(weights), N).  Sums in float32 with a
        float64 accumulator (relative error about 1e-6)."""
        N = len(ctx)
        out = np.empty((len(weights), N))
        excluded = np.flatnonzero(~self.predictable)
        for s in range(0, N, self.chunk):
            A, offset = nlm_log_scores(self.model, ctx[s:s + self.chunk])
            B = self.dist.log10_rows(histories[s:s + self.chunk], scale=LN10)
            # <s> and <null> are never predicted: out of the maxima and the sums
            A[:, excluded] = -np.inf
            B[:, excluded] = -np.inf
            amax, bmax = A.max(axis=1), B.max(axis=1)
            A[:, excluded] = 0.0
            B[:, excluded] = 0.0
            X = np.empty_like(A)
            Y = np.empty_like(A)
            for k, w in enumerate(weights):
                # shift by a bound on the row maximum: w max(A) + (1-w) max(B)
                shift = (w * amax + (1.0 - w) * bmax).astype(np.float32)
                np.multiply(A, np.float32(w), out=X)
                np.multiply(B, np.float32(1.0 - w), out=Y)
                X += Y
                X -= shift[:, None]
                X[:, excluded] = -np.inf
                np.exp(X, out=X)
                out[k, s:s + self.chunk] = (shift.astype(np.float64) - w * offset
                                            + np.log(X.sum(axis=1, dtype=np.float64)))
            if progress:
                progress(min(self.chunk, N - s))
        return out

    def tune(self, ctx: np.ndarray, histories: Sequence[Tuple[str, ...]], nlm: np.ndarray,
             kenlm: np.ndarray, rounds: int = 3, points: int = 7, progress=None) -> float:
        """Neural weight maximising the normalised likelihood of the tokens: a grid of
        ``points`` weights in [0, 1], refined ``rounds`` times around the best (the
        objective is concave in the weight)."""
        lo, hi = 0.0, 1.0
        best_w = 0.5
        for _ in range(rounds):
            ws = np.linspace(lo, hi, points)
            logz = self.log_normalisers(ctx, histories, ws, progress)
            ll = [float((w * nlm + (1 - w) * kenlm - logz[k]).sum()) for k, w in enumerate(ws)]
            k = int(np.argmax(ll))
            best_w = float(ws[k])
            step = (hi - lo) / (points - 1)
            lo, hi = max(0.0, best_w - step), min(1.0, best_w + step)
        return best_w

    def logprob(self, ctx: np.ndarray, histories: Sequence[Tuple[str, ...]], nlm: np.ndarray,
                kenlm: np.ndarray, weight: float, progress=None) -> np.ndarray:
        """Normalised log-linear natural-log probability of every token."""
        logz = self.log_normalisers(ctx, histories, [weight], progress)[0]
        return weight * nlm + (1 - weight) * kenlm - logz


def spaced_subset(n: int, limit: Optional[int]) -> np.ndarray:
    """Indices of at most ``limit`` evenly spaced items of ``n`` (all if limit is None)."""
    if limit is None or n <= limit:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, limit).round().astype(np.int64))
