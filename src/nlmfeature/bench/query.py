"""``nlmfeature bench query``: native lookup speed of every model x output layer.

Streams the n-grams of a real text one lookup at a time through the native scorer (as a
decoder does) and prints lookups/s on one and two threads, cache hit rates, resident
memory after load and the model file size.  Models have random weights (speed does not
depend on training) and the seed papers' sizes; the vocabulary is the training text's.
Each configuration runs in a fresh process so memory figures are its own.

The per-sentence caches are measured on a decoder-like stream: by default the bundled
query log of a real Moses search (every lookup Moses asked, in order, with its sentence
starts; nlmfeature/data/streams), with and without the caches ("cache x").  Each rate is
the median over a session's passes after its first (the first grows the cache tables, a
cost a decoder pays once per process); the decoder stream's first pass is shown beside it.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from nlmfeature.io.jsonout import dumps_json
from nlmfeature.bench import shared_data

from nlmfeature.mt.kbest import sentence_id
from nlmfeature.io.textio import iter_lines
from nlmfeature.core.model import DEFAULT_CACHE_ENTRIES

DEFAULT_DATA = shared_data()

#: name -> ModelSpec fields (the sizes the seed papers use)
MODELS: Dict[str, Dict[str, Any]] = {
    "lbl-diag-200": dict(arch="lbl", word_width=200, diagonal_contexts=True),
    "lbl-full-200": dict(arch="lbl", word_width=200),
    "nplm-150-750-150": dict(arch="nplm", word_width=150, hidden=750, hidden_layers=[150]),
    "lateral-2x500": dict(arch="lateral", word_width=150, hidden=500, branches=2, combine="max"),
}
OUTPUTS = ["unnormalised", "class", "tree", "softmax"]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _read(path: str, limit: Optional[int] = None) -> List[List[str]]:
    out = []
    for _, line in iter_lines(path):
        out.append(line.split())
        if limit and len(out) >= limit:
            break
    return out


def _nbest_stream(path: str, limit: int) -> List[Tuple[int, List[str]]]:
    """(sentence id, hypothesis tokens) of a Moses n-best list: a decoder-like query stream."""
    out = []
    for lineno, line in iter_lines(path):
        out.append((sentence_id(line, path, lineno), line.split("|||")[1].split()))
        if len(out) >= limit:
            break
    return out


def _stream_arrays(model, sentences: List[Tuple[int, List[str]]]):
    """Padded contexts, words and sentence-start indices for a list of (sid, tokens)."""
    ctxs, words, starts = [], [], []
    n, last = 0, None
    for sid, toks in sentences:
        if sid != last:
            starts.append(n)
            last = sid
        c, w = model.sentence_ngrams(toks)
        ctxs.append(c)
        words.append(w)
        n += len(w)
    return (np.ascontiguousarray(np.concatenate(ctxs)), np.ascontiguousarray(np.concatenate(words)),
            np.asarray(starts, dtype=np.int64))


def _timed(session, ctx, words, starts, min_seconds: float) -> Tuple[float, float]:
    """(lookups/s of the session's warm passes, lookups/s of its first pass) over the stream.

    The first pass of a session grows its cache tables to what a sentence needs (memory
    the process touches for the first time: on this VM up to three quarters of a class
    model's first pass over the four-sentence Moses stream); a decoder pays that once per
    process, not per sentence, so the figure is the median of the passes after it (at
    least three, ~``min_seconds`` in all) and the first pass is reported beside it."""
    t0 = time.perf_counter()
    session.score_stream(ctx, words, starts)
    first = len(words) / max(time.perf_counter() - t0, 1e-9)
    rates: List[float] = []
    t1 = time.perf_counter()
    while len(rates) < 3 or time.perf_counter() - t1 < min_seconds:
        t = time.perf_counter()
        session.score_stream(ctx, words, starts)
        rates.append(len(words) / max(time.perf_counter() - t, 1e-9))
    return float(np.median(rates)), first


def _run_one(cfg: Dict[str, Any], queue) -> None:
    try:
        queue.put(_measure(cfg))
    except BaseException as exc:  # report, never hang the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def _measure(cfg: Dict[str, Any]) -> Dict[str, Any]:
    import nlmfeature

    rss0 = _rss_mb()
    model = nlmfeature.load(cfg["path"], verify=False)
    text = _read(cfg["text"], cfg.get("text_lines"))
    sents = [(i, t) for i, t in enumerate(text)]
    ctx, words, starts = _stream_arrays(model, sents)
    limit = cfg.get("max_lookups")
    if limit and len(words) > limit:
        ctx, words = ctx[:limit], words[:limit]
        starts = starts[starts < limit]
    res: Dict[str, Any] = {}
    sess = model.session(cfg["cache"])
    res["lookups_per_s_1thread"], _ = _timed(sess, ctx, words, starts, cfg["seconds"])
    st = sess.stats()
    res["cache_hit_rate"] = (st["context_hits"] / max(1, st["context_hits"] + st["context_misses"])
                             if st["context_cache_enabled"] else None)
    res["rss_after_load_mb"] = round(_rss_mb() - rss0, 1)
    res["lookups_per_s_1thread_nocache"], _ = _timed(model.session(0), ctx, words, starts, cfg["seconds"])
    # two threads, one session each, sharing the model
    rates = [0.0, 0.0]

    def worker(k: int) -> None:
        s = model.session(cfg["cache"])
        rates[k] = _timed(s, ctx, words, starts, cfg["seconds"])[0]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    res["lookups_per_s_2threads"] = sum(rates)
    c2 = None
    if cfg.get("stream") == "nbest" and cfg.get("nbest"):
        c2, w2, s2 = _stream_arrays(model, _nbest_stream(cfg["nbest"], cfg.get("nbest_lines", 20000)))
    elif cfg.get("stream") not in (None, "", "nbest", "none"):
        from nlmfeature.decoder.querylog import load_stream
        c2, w2, s2 = load_stream(None if cfg["stream"] == "moses" else cfg["stream"], model,
                                 cfg.get("stream_sentences", 0))
        limit = cfg.get("stream_max_lookups")
        if limit and len(w2) > limit:  # exact softmax: a prefix of the stream
            c2, w2 = c2[:limit], w2[:limit]
            s2 = s2[s2 < limit]
    if c2 is not None:
        # a decoder's sessions (the C API's: normalisers from position terms)
        cached = model.session(cfg["cache"] or DEFAULT_CACHE_ENTRIES, position_terms=True)
        res["decoder_stream_cached_per_s"], res["decoder_stream_first_pass_per_s"] = _timed(
            cached, c2, w2, s2, cfg["seconds"])
        st = cached.stats()
        n = max(1, st["lookups"])
        # lookups that needed no new hidden vector / no normaliser computation
        res["decoder_stream_hit_rate"] = (1 - st["context_misses"] / n) if st["context_cache_enabled"] else None
        res["decoder_stream_ngram_hit_rate"] = st["ngram_hits"] / n if st["ngram_cache_enabled"] else None
        if st["class_hits"] + st["class_misses"]:
            res["decoder_stream_class_hit_rate"] = 1 - st["class_misses"] / n
        res["decoder_stream_lookups"] = int(len(w2))
        nocache = model.session(0)  # (as a decoder's session with the caches off)
        res["decoder_stream_uncached_per_s"], _ = _timed(nocache, c2, w2, s2, cfg["seconds"])
        res["cache_speedup"] = res["decoder_stream_cached_per_s"] / res["decoder_stream_uncached_per_s"]
    return res


def build_model(name: str, output: str, vocab, counts, order: int, path: str, classes: int) -> int:
    """Write a random model of configuration ``name`` with ``output``; returns the file size."""
    import nlmfeature
    from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model

    spec = ModelSpec(order=order, output=output, classes=classes, **MODELS[name])
    header, arrays = random_model(spec, vocab, counts, seed=1)
    precompute_tables(header, arrays)
    nlmfeature.save(path, header, arrays)
    return os.path.getsize(path)


def run(args: argparse.Namespace) -> int:
    from nlmfeature.io.progress import iterate
    from nlmfeature.core.vocab import Vocabulary, count_words

    data = args.data
    train = os.path.join(data, "mono", "brown", "train.txt.gz")
    text = os.path.join(data, "mono", "brown", args.text + ".txt.gz")
    nbest = os.path.join(data, "nbest", "moses-multi30k-de-en", "dev.iter1.100best.gz")
    counts = count_words(" ".join(t) for t in _read(train))
    vocab = Vocabulary.from_counts(counts, min_count=args.min_count, max_size=args.max_vocab)
    cnt = np.array([counts.get(w, 1) for w in vocab], dtype=np.float64)
    classes = args.classes or int(round(np.sqrt(len(vocab))))
    models = args.models.split(",") if args.models else list(MODELS)
    outputs = args.outputs.split(",") if args.outputs else OUTPUTS
    rows = []
    ctx = mp.get_context("spawn")
    workdir = args.workdir or tempfile.mkdtemp(prefix="nlmbench-")
    os.makedirs(workdir, exist_ok=True)
    jobs = [(m, o) for m in models for o in outputs]
    quiet = args.json or getattr(args, "quiet", False)
    for name, output in iterate(jobs, desc="bench query", unit="model", enabled=not quiet):
        path = os.path.join(workdir, f"{name}-{output}.nlm")
        size = build_model(name, output, vocab, cnt, args.order, path, classes)
        cfg = {"path": path, "text": text, "seconds": args.seconds, "cache": args.cache_entries,
               "max_lookups": args.max_lookups if output == "softmax" else None,
               "nbest": nbest if os.path.exists(nbest) else None,
               "nbest_lines": args.nbest_lines if output != "softmax" else 2000,
               "stream": args.decoder_stream, "stream_sentences": args.stream_sentences,
               "stream_max_lookups": 20000 if output == "softmax" else None}
        q = ctx.Queue()
        proc = ctx.Process(target=_run_one, args=(cfg, q))
        proc.start()
        res = q.get()
        proc.join()
        if not args.keep:
            os.unlink(path)
        res.update({"model": name, "output": output, "file_mb": round(size / 2**20, 1),
                    "vocab": len(vocab), "order": args.order})
        rows.append(res)
    if args.json:
        print(dumps_json(rows, indent=2))
    else:
        _print_table(rows)
    return 0


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.0f}" if x >= 100 else f"{x:.3f}"
    return str(x)


def _print_table(rows: List[Dict[str, Any]]) -> None:
    cols = ["model", "output", "lookups_per_s_1thread", "lookups_per_s_1thread_nocache",
            "lookups_per_s_2threads", "cache_hit_rate",
            "rss_after_load_mb", "file_mb", "decoder_stream_cached_per_s",
            "decoder_stream_first_pass_per_s", "decoder_stream_uncached_per_s",
            "decoder_stream_ngram_hit_rate", "decoder_stream_hit_rate", "decoder_stream_class_hit_rate",
            "cache_speedup"]
    head = ["model", "output", "lookups/s 1T", "1T no cache", "lookups/s 2T", "hit rate", "RSS MB", "file MB",
            "dec. cached/s", "1st pass/s", "dec. uncached/s", "n-gram hits", "ctx hits", "class hits", "cache x"]
    table = [head] + [[_fmt(r.get(c)) if "error" not in r else (r["error"] if c == "lookups_per_s_1thread"
                                                                 else _fmt(r.get(c))) for c in cols]
                      for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for r in table:
        print("  ".join(v.rjust(w) if i > 1 else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
