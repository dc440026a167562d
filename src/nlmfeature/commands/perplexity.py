"""``nlmfeature perplexity``: perplexity of a neural model, a KenLM baseline and their
linear and log-linear interpolations on the same test text, with the same OOV treatment."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional

import numpy as np

from nlmfeature.errors import InputError, NLMFeatureError
from nlmfeature.commands.base import MAX_INT, Number
from nlmfeature.io.jsonout import dumps_json
from nlmfeature.training.kenlm_baseline import (KENLM_MAX_ORDER, VOCAB_MISMATCH_WARN, KenLMScorer, LogLinear,
                              interpolate, is_arpa,
                              mixture_logprob, nlm_ngrams, nlm_token_scores, spaced_subset, train_kenlm,
                              tune_mixture)
from nlmfeature.io.atomicfile import check_output
from nlmfeature.io.textio import read_tokens
from nlmfeature.core.model import exactly_normalised, load

OOV_NOTE = ("Tokens: every word plus one </s> per sentence. OOV = word outside the neural "
            "vocabulary; both models score it as the unknown word ({}).")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "perplexity", help="perplexity of neural models, their mixture, a KenLM model and their interpolations",
        description="Report, on the same test text and with the same token and OOV conventions, "
                    "the perplexity of the neural model, of a KenLM n-gram model, and of their "
                    "linear and (exactly renormalised) log-linear interpolations, whose weight is "
                    "tuned on the validation text. Every word and one </s> per sentence are "
                    "predicted; a word outside the neural vocabulary is an OOV, scored by both "
                    "models as the unknown word and counted (unless --exclude-oov).  Several "
                    "--model files (left-to-right, same vocabulary) are also reported as their "
                    "token-level linear mixture, alone and with KenLM, the weights tuned on "
                    "--valid by EM.")
    p.add_argument("--model", "-m", required=True, metavar="NLM", action="append",
                   help="neural model file (.nlm); repeat it for a mixture of several models "
                        "(each is also reported alone; the log-linear interpolation is for one "
                        "model only)")
    p.add_argument("--exact", action="store_true",
                   help="renormalise the scores of unnormalised (NCE / self-normalised) models "
                        "exactly, by a softmax over the vocabulary per token, so that every "
                        "figure is a true perplexity (default: their raw scores, as a decoder "
                        "uses them); also reports how far the raw scores are from normalised "
                        "on this text: the raw-score perplexity and the per-token log Z (raw - "
                        "exact score) mean, spread, 95th percentile, maximum and share above 1 "
                        "nat (a decoder's output, scored so, shows whether the search seeks "
                        "out contexts the model overstates)"),
    p.add_argument("-i", "--input", "--test", dest="test", required=True, metavar="FILE",
                   help="test text, one sentence per line (.gz allowed)")
    p.add_argument("--kenlm", metavar="ARPA_OR_BIN",
                   help="KenLM model to compare with (log-linear interpolation needs the ARPA "
                        "file); best trained with --kenlm-train so that it predicts the same "
                        "events as the neural model")
    p.add_argument("--kenlm-train", metavar="TEXT",
                   help="train a modified Kneser-Ney model on TEXT with lmplz first (words "
                        "outside the neural vocabulary become one unknown token); written to "
                        "--kenlm if given, else next to the model as MODEL.kenlm<order>.arpa")
    p.add_argument("--kenlm-order", type=Number(int, 2, KENLM_MAX_ORDER), default=5, metavar="N",
                   help="order of the model --kenlm-train estimates (default 5)")
    p.add_argument("--valid", metavar="FILE",
                   help="validation text on which the interpolation weights are tuned "
                        "(without it and without --weight, no interpolation is reported)")
    p.add_argument("--weight", type=Number(float, 0, 1), metavar="W",
                   help="use this neural-model weight for both interpolations instead of tuning")
    p.add_argument("--tune-tokens", type=Number(int, 1, MAX_INT), default=10000, metavar="N",
                   help="tune the log-linear weight on at most N evenly spaced validation tokens "
                        "(each costs a pass over the vocabulary; default 10000); the linear "
                        "weight uses every validation token")
    p.add_argument("--no-loglinear", action="store_true",
                   help="skip the log-linear interpolation (it needs a whole-vocabulary pass "
                        "per test token)")
    p.add_argument("--exclude-oov", action="store_true",
                   help="skip OOV tokens for every model (SRILM's convention) instead of "
                        "scoring them as the unknown word")
    j = p.add_argument_group("joint models (--model trained with train --source)")
    j.add_argument("--source", metavar="FILE",
                   help="source side of the test text, line by line with --test (a joint model needs it)")
    j.add_argument("--alignment", metavar="FILE",
                   help="word alignment of --source/--test, i-j points (source position i, target "
                        "position j, from 0), one line per sentence pair")
    j.add_argument("--compare", metavar="NLM",
                   help="also score --test with this target-only neural model (same tokens and OOV "
                        "flags) and report the joint/target-only perplexity ratio")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def _row(name: str, logprob: np.ndarray, oov: np.ndarray, exclude: bool, **extra: Any) -> Dict:
    keep = ~oov if exclude else np.ones(len(logprob), dtype=bool)
    lp = logprob[keep]
    total = float(lp.sum())
    ppl = float(np.exp(-total / lp.size)) if lp.size else float("nan")
    row = {"model": name, "perplexity": ppl, "log_prob": total, "tokens": int(lp.size),
           "oovs": int(oov.sum())}
    row.update(extra)
    return row


def run(args: argparse.Namespace) -> int:
    if args.weight is not None and not 0.0 <= args.weight <= 1.0:
        raise NLMFeatureError(f"--weight must be in [0, 1] (got {args.weight})")
    paths: List[str] = args.model
    if len(paths) > 1 and args.weight is not None:
        raise NLMFeatureError("--weight is for one --model; the weights of a mixture of several "
                              "models are tuned on --valid")
    if args.kenlm_train:              # the ARPA written after training KenLM: check it first
        check_output(args.kenlm or f"{paths[0]}.kenlm{args.kenlm_order}.arpa", "KenLM output")
    models = [load(p) for p in paths]
    model = models[0]
    if any(m.header.get("source") for m in models):
        if len(models) > 1:
            raise NLMFeatureError("a joint model is measured alone (give one --model; compare it "
                                  "with a target-only model by --compare)")
        args.model = paths[0]
        return _run_joint(args, model)
    if args.source or args.alignment or args.compare:
        raise NLMFeatureError(f"{paths[0]} is a target-only model: --source, --alignment and "
                              "--compare apply to joint models")
    _check_mixture(models)
    test = _nonempty(read_tokens(args.test), args.test)
    valid = _nonempty(read_tokens(args.valid), args.valid) if args.valid else None
    kenlm_path: Optional[str] = args.kenlm
    if args.kenlm_train:
        kenlm_path = kenlm_path or f"{paths[0]}.kenlm{args.kenlm_order}.arpa"
        _log(args, f"training a {args.kenlm_order}-gram KenLM model on {args.kenlm_train} "
                   f"-> {kenlm_path}")
        train_kenlm(args.kenlm_train, kenlm_path, args.kenlm_order, vocab=model.vocab)

    ex = args.exclude_oov
    scores = [nlm_token_scores(m, test, exact=args.exact) for m in models]
    nlm = scores[0]
    rows: List[Dict] = [_row("neural" if i == 0 else f"neural{i + 1}", s.logprob, s.oov, ex)
                        for i, s in enumerate(scores)]
    notes = []
    raws = [nlm_token_scores(m, test) if args.exact and not m.normalised else s
            for m, s in zip(models, scores)]       # the raw scores a decoder adds
    if args.exact:
        notes.append("unnormalised models renormalised exactly (--exact)")
        for row, m, s, r in zip(rows, models, scores, raws):
            if not m.normalised:
                row.update(_normalisation(r.logprob, s.logprob, s.oov, ex))
                notes.append(f"{row['model']}: " + _normalisation_note(row))
    result: Dict[str, Any] = {"model": paths[0] if len(paths) == 1 else paths, "test": args.test,
                              "exclude_oov": ex}
    vscores = [nlm_token_scores(m, valid, exact=args.exact) for m in models] if valid is not None else None
    vkeep = (~vscores[0].oov if ex else slice(None)) if vscores else None
    if len(models) > 1:
        if vscores is None:
            notes.append("no --valid: the mixture of the neural models is not reported")
        else:
            w = tune_mixture(np.stack([v.logprob[vkeep] for v in vscores]))
            mix = mixture_logprob(np.stack([s.logprob for s in scores]), w)
            rows.append(_row("mixture", mix, nlm.oov, ex, weight=[round(float(x), 4) for x in w]))
    if kenlm_path:
        scorer = KenLMScorer(kenlm_path, model.vocab)
        kn, kn_oov = scorer.token_scores(test)
        _check_kenlm(args, scorer, kn_oov, test, notes)
        result["kenlm"] = kenlm_path
        rows.append(_row("kenlm", kn.logprob, kn.oov, ex, kenlm_unknown_tokens=kn_oov))
        notes.append(OOV_NOTE.format(
            f"KenLM: {scorer.unk_token}" + ("" if scorer.unk_token != "<unk>" else
                                            ", KenLM's own unknown word: the KenLM model was not "
                                            "trained with this vocabulary")))
        if not all(m.normalised for m in models) and not args.exact:
            notes.append("the neural model's output layer is unnormalised: its perplexity and "
                         "the linear interpolation use raw scores (--exact renormalises them); "
                         "the log-linear one is renormalised exactly")
        if model.reverse:
            notes.append("right-to-left model (trained with --reverse): its perplexity is over the "
                         "same text read backwards; token-by-token interpolation with the left-to-right "
                         "KenLM model is not defined, so none is reported")
        elif len(models) > 1:
            if vscores is not None:
                vk, _ = scorer.token_scores(valid)
                w = tune_mixture(np.stack([v.logprob[vkeep] for v in vscores] + [vk.logprob[vkeep]]))
                lin = mixture_logprob(np.stack([s.logprob for s in scores] + [kn.logprob]), w)
                rows.append(_row("linear", lin, nlm.oov, ex, weight=[round(float(x), 4) for x in w]))
                notes.append("linear: the mixture of the neural models and KenLM (weights in "
                             "--model order, KenLM's last); log-linear interpolation is reported "
                             "for one --model only")
        elif valid is not None or args.weight is not None:
            if valid is not None:
                vn = vscores[0]
                vk, _ = scorer.token_scores(valid)
            w_lin = args.weight
            if w_lin is None:
                _, w_lin = interpolate(vn.logprob[vkeep], vk.logprob[vkeep])
            lin, _ = interpolate(nlm.logprob, kn.logprob, weight=w_lin)
            rows.append(_row("linear", lin, nlm.oov, ex, weight=round(w_lin, 4)))
            if args.no_loglinear:
                pass
            elif not is_arpa(kenlm_path):
                notes.append("log-linear interpolation skipped: it needs the ARPA file, and "
                             f"{kenlm_path} is a KenLM binary")
            elif model.header.get("direct"):
                notes.append("log-linear interpolation skipped: whole-vocabulary distributions "
                             "of models with direct n-gram features are not supported")
            else:
                rows.append(_loglinear(args, model, kenlm_path, scorer, test, valid, raws[0], kn))
        else:
            notes.append("no --valid (or --weight): interpolations not reported")
    return _emit(args, result, rows, notes)


def _emit(args: argparse.Namespace, result: Dict[str, Any], rows: List[Dict], notes: List[str]) -> int:
    result["rows"] = rows
    result["notes"] = notes
    if args.json:
        print(dumps_json(result, indent=2))
    else:
        _print_table(rows, notes)
    return 0


def _check_mixture(models) -> None:
    """Several models are mixed token by token: same events, same direction."""
    first = models[0]
    for m in models[1:]:
        if list(m.vocab) != list(first.vocab):
            raise NLMFeatureError(f"{m.path}: its vocabulary differs from {first.path}'s; a mixture "
                                  "needs models trained with the same vocabulary (same text and "
                                  "--min-count / --max-vocab)")
    if len(models) > 1 and any(m.reverse for m in models):
        rev = next(m for m in models if m.reverse)
        raise NLMFeatureError(f"{rev.path}: a right-to-left model (--reverse) cannot be mixed token "
                              "by token with others; give left-to-right models only")


def _check_kenlm(args, scorer: KenLMScorer, kn_oov: int, test, notes: List[str]) -> None:
    """Refuse or warn when the KenLM numbers would be silent nonsense."""
    if scorer.missing_unk and kn_oov:
        raise NLMFeatureError(
            f"{scorer.path}: the ARPA file has no <unk> entry, so KenLM gives the {kn_oov} test "
            "token(s) it does not know log10 probability -100 and its perplexity is meaningless; "
            "use a model with <unk> (lmplz always writes it; --kenlm-train trains one on the "
            "neural model's vocabulary)")
    unknown, known = scorer.unknown_known_words(test)
    if known and unknown / known > VOCAB_MISMATCH_WARN:
        msg = (f"KenLM model {scorer.path} does not know {unknown} of the {known} test tokens "
               f"({100.0 * unknown / known:.1f}%) that the neural vocabulary knows: it was built "
               "for another vocabulary (other text, tokenisation or casing?), so the two models "
               "predict different events; --kenlm-train TEXT trains a comparable one")
        notes.append(msg)
        print(f"nlmfeature perplexity: warning: {msg}", file=sys.stderr)


def _normalisation(raw: np.ndarray, exact: np.ndarray, oov: np.ndarray, exclude: bool) -> Dict[str, float]:
    """How far an unnormalised model's raw scores are from log-probabilities on a text: per
    token log Z = raw score - exact score (the log of the softmax normaliser of its context;
    0 for a perfectly self-normalised model).  A decoder adds the raw scores, so a positive
    log Z overstates the token by that many nats: its mean is the bias, its spread and upper
    tail what a search can seek out."""
    keep = ~oov if exclude else np.ones(len(raw), dtype=bool)
    z = (raw - exact)[keep]
    if not z.size:
        return {}
    return {"raw_perplexity": float(np.exp(-raw[keep].mean())), "log_z_mean": float(z.mean()),
            "log_z_sd": float(z.std()), "log_z_p95": float(np.percentile(z, 95)),
            "log_z_max": float(z.max()), "log_z_over_1": float((z > 1).mean())}


def _normalisation_note(row: Dict[str, Any]) -> str:
    if "log_z_mean" not in row:
        return "no tokens"
    return (f"raw-score perplexity {row['raw_perplexity']:.3f}; log Z per token (raw - exact): "
            f"mean {row['log_z_mean']:.3f}, sd {row['log_z_sd']:.3f}, 95th percentile "
            f"{row['log_z_p95']:.3f}, max {row['log_z_max']:.2f}; "
            f"{100 * row['log_z_over_1']:.2f}% of tokens above 1 nat")


def _nonempty(sentences: List, path: str) -> List:
    """``sentences``, or an error: a perplexity over no tokens is undefined."""
    if not sentences:
        raise InputError(path, 0, "the file is empty: no sentences to measure the perplexity of")
    return sentences


def _run_joint(args: argparse.Namespace, model) -> int:
    """Perplexity of a joint model on a parallel test set, beside a target-only model and
    KenLM on the same target tokens."""
    from nlmfeature.core.joint import joint_token_scores, read_parallel

    if not (args.source and args.alignment):
        raise NLMFeatureError(f"{args.model} is a joint model: give the test set's --source and "
                              "--alignment too")
    if args.valid or args.weight is not None or args.kenlm_train:
        raise NLMFeatureError("interpolation (--valid, --weight) and --kenlm-train are not "
                              "supported for joint models; compare with --kenlm and --compare")
    # an inverse model (train --target-to-source) predicts --source given --test
    srcs, tgts, affs = read_parallel(args.source, args.test, args.alignment, keep_empty=True,
                                     target_to_source=model.target_to_source)
    _nonempty(tgts, args.test)
    ex = args.exclude_oov
    notes: List[str] = []
    js = joint_token_scores(exactly_normalised(model) if args.exact else model, srcs, tgts, affs)
    extra: Dict[str, Any] = {"source_window": model.window}
    if args.exact and not model.normalised:
        raw = joint_token_scores(model, srcs, tgts, affs)
        extra.update(_normalisation(raw.logprob, js.logprob, js.oov, ex))
        notes.append("joint model renormalised exactly (--exact): " + _normalisation_note(extra))
    if model.target_to_source:
        notes.append(f"inverse joint model (train --target-to-source): the perplexity is of the "
                     f"--source text {args.source} given --test; --compare and --kenlm models "
                     "score the --source text too")
    rows: List[Dict] = [_row("joint", js.logprob, js.oov, ex, **extra)]
    result: Dict[str, Any] = {"model": args.model, "test": args.test, "source": args.source,
                              "alignment": args.alignment, "exclude_oov": ex}
    if args.compare:
        lm = load(args.compare)
        if lm.header.get("source"):
            raise NLMFeatureError(f"--compare {args.compare}: expected a target-only model")
        if lm.vocab != model.vocab:
            notes.append("the target-only model has another vocabulary: OOV flags follow the joint model's")
        ts = nlm_token_scores(lm, tgts, exact=args.exact)
        rows.append(_row("target-only", ts.logprob, js.oov, ex))
        result["compare"] = args.compare
        result["ratio"] = rows[0]["perplexity"] / rows[1]["perplexity"]
        notes.append(f"joint / target-only perplexity: {result['ratio']:.3f}")
    if args.kenlm:
        scorer = KenLMScorer(args.kenlm, model.vocab)
        kn, kn_oov = scorer.token_scores(tgts)
        result["kenlm"] = args.kenlm
        rows.append(_row("kenlm", kn.logprob, js.oov, ex, kenlm_unknown_tokens=kn_oov))
    if not model.normalised and not args.exact:
        notes.append("the joint model's output layer is unnormalised: its perplexity uses raw scores "
                     "(--exact renormalises them)")
    return _emit(args, result, rows, notes)


def _loglinear(args, model, kenlm_path, scorer, test, valid, nlm, kn) -> Dict:
    ex = args.exclude_oov
    sets = [test] + ([valid] if valid is not None else [])
    ll = LogLinear(model, kenlm_path, scorer, sets)
    ctx, _ = nlm_ngrams(model, test)
    hist = scorer.histories(test)
    w = args.weight
    tuned_on = None
    if w is None:
        vn = nlm_token_scores(model, valid)
        vk, _ = scorer.token_scores(valid)
        vctx, _ = nlm_ngrams(model, valid)
        vhist = scorer.histories(valid)
        idx = np.flatnonzero(~vn.oov) if ex else np.arange(len(vn.logprob))
        idx = idx[spaced_subset(len(idx), args.tune_tokens)]
        tuned_on = int(idx.size)
        bar = _bar(args, 3 * idx.size, "tuning log-linear weight")
        w = ll.tune(vctx[idx], [vhist[i] for i in idx], vn.logprob[idx], vk.logprob[idx],
                    progress=bar.update if bar else None)
        if bar:
            bar.close()
    bar = _bar(args, len(hist), "log-linear on test")
    lp = ll.logprob(ctx, hist, nlm.logprob, kn.logprob, w, progress=bar.update if bar else None)
    if bar:
        bar.close()
    extra = {"weight": round(w, 4)}
    if tuned_on is not None:
        extra["tuned_on_tokens"] = tuned_on
    return _row("log-linear", lp, nlm.oov, ex, **extra)


def _bar(args, total: int, desc: str):
    if args.quiet:
        return None
    from nlmfeature.io.progress import progress

    return progress(total=total, desc=desc, unit="tok")


def _log(args, msg: str) -> None:
    if not args.quiet:
        print(f"nlmfeature perplexity: {msg}", file=sys.stderr)


def _print_table(rows: List[Dict], notes: List[str]) -> None:
    print(f"{'model':12s} {'perplexity':>12s} {'log_prob':>14s} {'tokens':>9s} {'oovs':>7s}  weight")
    for r in rows:
        w = r.get("weight")
        print(f"{r['model']:12s} {r['perplexity']:12.3f} {r['log_prob']:14.2f} {r['tokens']:9d} "
              f"{r['oovs']:7d}  {'' if w is None else (' '.join(map(str, w)) if isinstance(w, list) else w)}")
    for n in notes:
        print(f"# {n}")
