"""Corpus BLEU and chrF (sacrebleu) with paired bootstrap significance: the work of
``nlmfeature eval`` (alias ``nlmfeature-eval``; its flags are :mod:`nlmfeature.commands.eval`'s).

Scores are sacrebleu's own (``BLEU().corpus_score`` / ``CHRF().corpus_score`` with the
printed signature).  With two systems, paired bootstrap resampling (Koehn 2004, as Moses'
``bootstrap-hypothesis-difference-significance.pl`` and ``sacrebleu --paired-bs``) gives the
p-value of the score difference.  It works on the per-sentence sufficient statistics
(BLEU: lengths and n-gram matches/totals; chrF: character/word n-gram counts): each resample
is a row of sentence counts, the resampled corpus statistics of all resamples are one matrix
product, and the scores are computed for all resamples at once with numpy.  With the same
seed it draws the same resamples as ``sacrebleu --paired-bs`` and gives its p-value, except
that a difference equal to the observed one counts as "as large" (``>=``): a system compared
with itself gets p = 1, where sacrebleu reports 1/(samples+1).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from nlmfeature.io.jsonout import dumps_json
from nlmfeature.mt.bleu import DEFAULT_TOKENIZE, corpus_bleu
from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.io.textio import read_lines



# -- inputs ------------------------------------------------------------------------------------
def check_lengths(system_paths: Sequence[str], systems: Sequence[List[str]],
                  ref_paths: Sequence[str], refs: Sequence[List[str]]) -> None:
    """Raise :class:`InputError` unless every system and reference has the same line count."""
    files = list(zip(system_paths, systems)) + list(zip(ref_paths, refs))
    n = len(files[0][1])
    if n == 0:
        raise InputError(files[0][0], 0, "the file is empty")
    for path, lines in files[1:]:
        if len(lines) != n:
            short_path, short, other, other_n = ((path, len(lines), files[0][0], n)
                                                 if len(lines) < n else
                                                 (files[0][0], n, path, len(lines)))
            raise InputError(short_path, short + 1,
                             f"the file ends after {short} lines, but {other} has {other_n}: "
                             "systems and references must be line-aligned")


# -- metrics -----------------------------------------------------------------------------------
#: the metrics ``eval`` computes
METRICS = ("bleu", "chrf")


def make_metrics(tokenize: str = DEFAULT_TOKENIZE, lowercase: bool = False, chrf_word_order: int = 0,
                 metrics: Sequence[str] = METRICS) -> Dict[str, Any]:
    """sacrebleu metric objects by name (``bleu``, ``chrf``)."""
    from sacrebleu.metrics import BLEU, CHRF

    out: Dict[str, Any] = {}
    for m in metrics:
        if m == "bleu":
            # tokenize=none means the text is tokenised on purpose: no "detokenize" warning
            out["bleu"] = BLEU(tokenize=tokenize, lowercase=lowercase, force=tokenize == "none")
        elif m == "chrf":
            out["chrf"] = CHRF(word_order=chrf_word_order, lowercase=lowercase)
        else:
            raise NLMFeatureError(f"unknown metric {m!r}; use bleu and/or chrf")
    return out


def sentence_stats(metric: Any, hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> np.ndarray:
    """Per-sentence sufficient statistics (N, k) of a sacrebleu metric (float64)."""
    extract = getattr(metric, "_extract_corpus_statistics", None) or \
        getattr(metric, "extract_corpus_statistics", None)
    if extract is None:   # pragma: no cover - depends on the sacrebleu version
        import sacrebleu
        raise NLMFeatureError(f"sacrebleu {sacrebleu.__version__} has no corpus-statistics "
                              "method; install sacrebleu 2.x (pip install 'sacrebleu>=2,<3')")
    return np.asarray(extract(list(hyps), [list(r) for r in refs]), dtype=np.float64)


def chrf_from_stats(stats: np.ndarray, beta: int = 2, eps_smoothing: bool = False) -> np.ndarray:
    """chrF (0-100) of summed statistics, one row per corpus: ``[hyp, ref, match]`` per order
    (character orders then word orders), as sacrebleu's ``CHRF._compute_f_score``."""
    s = np.atleast_2d(stats).astype(np.float64)
    n_hyp, n_ref, n_match = s[:, 0::3], s[:, 1::3], s[:, 2::3]
    eps = 1e-16
    factor = beta ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        prec = np.where(n_hyp > 0, n_match / np.where(n_hyp > 0, n_hyp, 1), eps)
        rec = np.where(n_ref > 0, n_match / np.where(n_ref > 0, n_ref, 1), eps)
        if eps_smoothing:
            denom = factor * prec + rec
            f = np.where(denom > 0, (1 + factor) * prec * rec / np.where(denom > 0, denom, 1), eps)
            return 100 * f.mean(axis=1)
        valid = (n_hyp > 0) & (n_ref > 0)
        eff = valid.sum(axis=1)
        avg_prec = np.where(eff > 0, (prec * valid).sum(axis=1) / np.maximum(eff, 1), 0.0)
        avg_rec = np.where(eff > 0, (rec * valid).sum(axis=1) / np.maximum(eff, 1), 0.0)
        denom = factor * avg_prec + avg_rec
        score = np.where(avg_prec + avg_rec > 0,
                         100 * (1 + factor) * avg_prec * avg_rec / np.where(denom > 0, denom, 1), 0.0)
    return score


def scores_from_stats(name: str, metric: Any, stats: np.ndarray) -> np.ndarray:
    """Vectorised corpus scores of summed statistics rows for metric ``name``."""
    if name == "bleu":
        if metric.smooth_method != "exp" or metric.effective_order:
            raise NLMFeatureError("vectorised BLEU supports sacrebleu's corpus defaults only")
        return corpus_bleu(np.atleast_2d(stats), max_order=metric.max_ngram_order)
    return chrf_from_stats(stats, metric.beta, metric.eps_smoothing)


# -- bootstrap ---------------------------------------------------------------------------------
def resample_indices(n: int, samples: int, seed: Optional[int]) -> np.ndarray:
    """(samples, n) sentence indices drawn with replacement, exactly as sacrebleu's paired
    bootstrap draws them (``default_rng(seed).choice(n, size=(samples, n))``)."""
    rng = np.random.default_rng(seed)
    return rng.choice(n, size=(samples, n), replace=True)


def resampled_sums(stats: np.ndarray, idx: np.ndarray, block_bytes: int = 64 << 20) -> np.ndarray:
    """Summed statistics of each resample (samples, k): per block of resamples, a count
    matrix (how often each sentence was drawn) times the statistics matrix."""
    samples, n = idx.shape
    out = np.empty((samples, stats.shape[1]), dtype=np.float64)
    block = max(1, block_bytes // (8 * max(n, 1)))
    for a in range(0, samples, block):
        b = min(samples, a + block)
        rows = idx[a:b] + (np.arange(b - a, dtype=np.int64) * n)[:, None]
        counts = np.bincount(rows.ravel(), minlength=(b - a) * n).reshape(b - a, n)
        out[a:b] = counts.astype(np.float64) @ stats
    return out


def confidence(scores: np.ndarray) -> Tuple[float, float]:
    """(mean, half width of the 95% interval) of bootstrap scores, as sacrebleu reports."""
    s = np.sort(scores)
    lo = len(s) // 40
    return float(s.mean()), float(0.5 * (s[len(s) - lo - 1] - s[lo]))


@dataclass
class Comparison:
    """Paired bootstrap comparison of system B against baseline A for one metric."""

    metric: str
    baseline: float
    system: float
    difference: float            #: system - baseline
    p_value: float               #: probability of a difference this large by chance
    samples: int
    seed: Optional[int]
    baseline_mean: float
    baseline_ci: float
    system_mean: float
    system_ci: float
    system_better_fraction: float  #: share of resamples where the system scores higher


def paired_bootstrap(name: str, metric: Any, stats_a: np.ndarray, stats_b: np.ndarray,
                     samples: int = 1000, seed: Optional[int] = 12345) -> Comparison:
    """Paired bootstrap resampling between baseline A and system B from per-sentence
    statistics (N, k) each.  p-value as sacrebleu / multeval: the share (with +1 smoothing)
    of resamples whose centred absolute difference reaches the observed one.  (Koehn's
    one-sided view is ``system_better_fraction``: the share of resamples where B wins.)"""
    idx = resample_indices(len(stats_a), samples, seed)
    sa = scores_from_stats(name, metric, resampled_sums(stats_a, idx))
    sb = scores_from_stats(name, metric, resampled_sums(stats_b, idx))
    a = float(scores_from_stats(name, metric, stats_a.sum(axis=0))[0])
    b = float(scores_from_stats(name, metric, stats_b.sum(axis=0))[0])
    diffs = np.abs(sb - sa)
    centred = diffs - diffs.mean()
    # sacrebleu counts `centred > observed`; with `>=` the two agree except on exact ties,
    # and a system compared with itself gets p = 1 (sacrebleu: 1 / (samples + 1))
    p = (int(np.sum(centred >= abs(b - a))) + 1) / (samples + 1)
    am, ac = confidence(sa)
    bm, bc = confidence(sb)
    return Comparison(name, a, b, b - a, p, samples, seed, am, ac, bm, bc,
                      float(np.mean(sb > sa)))


# -- evaluation --------------------------------------------------------------------------------
@dataclass
class SystemResult:
    path: str
    scores: Dict[str, float] = field(default_factory=dict)
    formatted: Dict[str, str] = field(default_factory=dict)      #: sacrebleu's score line
    signatures: Dict[str, str] = field(default_factory=dict)
    sentence_scores: Dict[str, List[float]] = field(default_factory=dict)


def evaluate(system_paths: Sequence[str], ref_paths: Sequence[str], tokenize: str = DEFAULT_TOKENIZE,
             lowercase: bool = False, metrics: Sequence[str] = ("bleu", "chrf"),
             chrf_word_order: int = 0, bootstrap: int = 1000, seed: Optional[int] = 12345,
             sentence_level: bool = False,
             detok: Optional[str] = None) -> Tuple[List[SystemResult], List[Comparison]]:
    """Score 1 or 2 systems against the references; with 2, compare them (the first is the
    baseline).  ``detok`` (a language code such as ``"en"``) first detokenises the system
    outputs with sacremoses' Moses detokenizer, for BLEU as papers report it (raw references,
    ``tokenize="13a"``).  Raises :class:`InputError` on unreadable or misaligned files."""
    if not ref_paths:
        raise NLMFeatureError("give at least one reference with --ref")
    if not 1 <= len(system_paths) <= 2:
        raise NLMFeatureError("give one system output, or two to compare them (as SYS "
                              "arguments or with -i)")
    if detok is not None and not isinstance(detok, str):
        raise TypeError(f"evaluate: detok must be a language code (str) or None, not "
                        f"{type(detok).__name__}")
    systems = [read_lines(p, stream=True) for p in system_paths]   # a pipe is fine
    if detok:
        from nlmfeature.mt.prepare import detokenise

        systems = [list(detokenise(lines, detok)) for lines in systems]
    refs = [read_lines(p) for p in ref_paths]
    check_lengths(system_paths, systems, ref_paths, refs)
    mets = make_metrics(tokenize, lowercase, chrf_word_order, metrics)
    results: List[SystemResult] = []
    stats: Dict[str, List[np.ndarray]] = {m: [] for m in mets}
    for path, hyps in zip(system_paths, systems):
        r = SystemResult(path)
        for name, metric in mets.items():
            st = sentence_stats(metric, hyps, refs)
            stats[name].append(st)
            score = metric._aggregate_and_compute(st.astype(np.int64).tolist()
                                                  if name == "bleu" else st.tolist())
            sig = metric.get_signature().format()
            r.scores[name] = float(score.score)
            r.formatted[name] = score.format(signature=sig)
            r.signatures[name] = sig
            if sentence_level:
                r.sentence_scores[name] = _sentence_scores(name, metric, st)
        results.append(r)
    comps: List[Comparison] = []
    if len(systems) == 2 and bootstrap > 0:
        for name, metric in mets.items():
            comps.append(paired_bootstrap(name, metric, stats[name][0], stats[name][1],
                                          bootstrap, seed))
    return results, comps


def _sentence_scores(name: str, metric: Any, st: np.ndarray) -> List[float]:
    """Per-sentence scores as ``sacrebleu.sentence_bleu`` / ``sentence_chrf`` give them
    (sentence BLEU with effective order, exp smoothing)."""
    if name == "bleu":
        from sacrebleu.metrics import BLEU

        return [float(BLEU.compute_bleu(list(map(int, row[2:2 + metric.max_ngram_order])),
                                        list(map(int, row[2 + metric.max_ngram_order:])),
                                        int(row[0]), int(row[1]), smooth_method="exp",
                                        effective_order=True,
                                        max_ngram_order=metric.max_ngram_order).score)
                for row in st]
    return [float(x) for x in chrf_from_stats(st, metric.beta, metric.eps_smoothing)]


# -- command line ------------------------------------------------------------------------------
def _report_text(results: List[SystemResult], comps: List[Comparison], width: int,
                 sentence_level: bool) -> str:
    lines: List[str] = []
    for r in results:
        lines.append(f"{r.path}:")
        for name in r.scores:
            lines.append(f"  {r.formatted[name]}")
    for c in comps:
        lines.append(
            f"{c.metric}: {results[1].path} vs {results[0].path}: "
            f"{c.system:.{width}f} - {c.baseline:.{width}f} = {c.difference:+.{width}f}, "
            f"p = {c.p_value:.4f} (paired bootstrap, {c.samples} resamples, seed {c.seed}; "
            f"95% CI {c.baseline_mean:.{width}f} ± {c.baseline_ci:.{width}f} vs "
            f"{c.system_mean:.{width}f} ± {c.system_ci:.{width}f})")
    if sentence_level:
        names = list(results[0].scores)
        lines.append("sentence\t" + "\t".join(f"{n}[{i + 1}]" for i in range(len(results))
                                              for n in names))
        n_sent = len(next(iter(results[0].sentence_scores.values())))
        for k in range(n_sent):
            vals = [r.sentence_scores[n][k] for r in results for n in names]
            lines.append(f"{k + 1}\t" + "\t".join(f"{v:.{width}f}" for v in vals))
    return "\n".join(lines) + "\n"


def parse_metrics(values: Sequence[str]) -> List[str]:
    """The metric names of ``-m``: separate words or comma-separated lists (checked by
    :func:`make_metrics`)."""
    return [m.strip().lower() for v in values for m in v.split(",") if m.strip()] or list(METRICS)


def run(args: argparse.Namespace) -> int:
    """Run ``nlmfeature eval`` on parsed arguments."""
    metrics = parse_metrics(args.metrics)
    args.systems = list(args.systems) + list(args.input)
    default_tok = args.tokenize == DEFAULT_TOKENIZE and not args.detok
    if args.bootstrap < 0:
        raise NLMFeatureError("--bootstrap must be >= 0")
    from sacrebleu.metrics.bleu import BLEU

    if args.detok and args.tokenize == "none":   # detokenised output is scored as papers do
        args.tokenize = "13a"
    if args.tokenize not in BLEU.TOKENIZERS:
        raise NLMFeatureError(f"unknown --tokenize {args.tokenize!r}; choose from "
                              f"{', '.join(BLEU.TOKENIZERS)}")
    if args.tok_ref and not args.detok:
        raise NLMFeatureError("--tok-ref goes with --detok (the tokenised scores beside the "
                              "detokenised ones)")
    runs = [("detokenised" if args.detok else "", args.ref, args.tokenize, args.detok)]
    if args.tok_ref:
        runs.append(("tokenised", args.tok_ref, "none", None))
    reports = []
    for label, refs, tokenize, detok in runs:
        results, comps = evaluate(args.systems, refs, tokenize, args.lowercase, metrics,
                                  args.chrf_word_order, args.bootstrap, args.seed,
                                  args.sentence_level, detok=detok)
        reports.append((label, results, comps))
    if args.json:
        docs = {}
        for label, results, comps in reports:
            docs[label or "scores"] = {
                "systems": [{"path": r.path, "scores": r.scores, "signatures": r.signatures,
                             **({"sentence_scores": r.sentence_scores}
                                if args.sentence_level else {})}
                            for r in results],
                "comparisons": [c.__dict__ for c in comps],
            }
        doc = docs.get("scores") or {**docs["detokenised"], "detokenise": args.detok,
                                     **({"tokenised": docs["tokenised"]}
                                        if "tokenised" in docs else {})}
        print(dumps_json(doc, indent=1, ensure_ascii=False))
    else:
        for label, results, comps in reports:
            if label == "detokenised":
                sys.stdout.write(f"== detokenised (sacremoses, {args.detok}) against "
                                 f"{', '.join(args.ref)}, --tokenize {args.tokenize}\n")
            elif label:
                sys.stdout.write(f"== tokenised against {', '.join(args.tok_ref)}, "
                                 "--tokenize none\n")
            sys.stdout.write(_report_text(results, comps, args.width, args.sentence_level))
        if default_tok and "bleu" in metrics:
            sys.stdout.write(f"BLEU tokenizer: {DEFAULT_TOKENIZE} (the default: the text is "
                             "tokenised already, as decoder output; -tok 13a for detokenised "
                             "text)\n")
    return 0
