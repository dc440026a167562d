#!/usr/bin/env python3
"""Replay a decoder's query log through one model's native session: CPU ns per lookup and a
digest of every score (scorer changes that must keep scores bit-identical are checked by the
digest; speed levers by the ns/lookup, paired: run before and after in turn).

Record a log with ``NLMFEATURE_QUERY_LOG=DIR`` in a decoder's environment and pack it with
``nlmfeature querylog pack DIR/queries.PID.N.bin --model MODEL --out X.qlog.xz``
(docs/c-api.md); without ``--stream`` the bundled Moses stream is replayed.  Example (the
figures of docs/performance.md)::

    python3 benchmarks/replay_querylog.py class.nlm --stream m30k-class.qlog.xz --repeats 3

With ``--persistent-cache DIR`` the streams (``--stream`` repeated: one log per tuning
iteration, recorded with each iteration's weights) are replayed as a tuning loop through the
persistent tuning cache: each iteration's stream scored without the cache and with
``DIR`` (emptied first, carried over between iterations), then the last stream once more
("unchanged weights").  Per iteration: CPU seconds without and with the cache, each the
least of ``--repeats`` passes (the cached ones each on a copy of the directory as the
iteration found it, and split into sentence begin: mapping and checking files, scoring,
sentence end: writing), their ratio and whether both gave the same scores; then the mean ratio of iterations 2..k and the
directory's size.  Beside each ratio, the bound the iteration's reuse allows: the share of its
distinct n-grams that earlier iterations asked in the same sentence (what the files can hold)
and the cost of the stream when every lookup is a hit of the session's table (each
sentence scored twice, the second pass timed); the bound is that cost plus the
not-on-disk share of the rest of the uncached cost (the unchanged-weights bound is the
all-hits cost alone: a cache cannot make a lookup cheaper than a hit).  The scorer's own cost only, without a decoder around it: in Moses the same
ratios come out higher (its own work evicts the tables from the CPU caches; docs/c-api.md)::

    for i in 1 2 3 4; do NLMFEATURE_QUERY_LOG=ql$i moses -f it$i.ini -i dev.src > /dev/null
        nlmfeature querylog pack ql$i/queries.*.1.bin --model class.nlm --out it$i.qlog.xz; done
    python3 benchmarks/replay_querylog.py class.nlm --persistent-cache /tmp/pc \
        --stream it1.qlog.xz --stream it2.qlog.xz --stream it3.qlog.xz --stream it4.qlog.xz
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from typing import List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
import numpy as np  # noqa: E402

import nlmfeature  # noqa: E402
from nlmfeature.decoder import querylog  # noqa: E402
from nlmfeature.commands.base import size_bytes  # noqa: E402


def _digest(scores: np.ndarray) -> str:
    return hashlib.sha1(scores.tobytes()).hexdigest()[:12]


def _loop_pass(scorer, stream) -> Tuple[List[float], str]:
    """One pass of a stream through a CachedScorer: CPU seconds in sentence begin, scoring and
    sentence end, and the digest of every score."""
    ctx, words, starts = stream
    bounds = list(starts) + [len(words)]
    t = [0.0, 0.0, 0.0]
    parts = []
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        t0 = time.process_time()
        scorer.begin(k)
        t1 = time.process_time()
        parts.append(scorer.score_padded(ctx[a:b], words[a:b]))
        t2 = time.process_time()
        scorer.end()
        t3 = time.process_time()
        t[0] += t1 - t0
        t[1] += t2 - t1
        t[2] += t3 - t2
    return t, _digest(np.concatenate(parts) if parts else np.zeros(0))


def _hits_pass(scorer, stream) -> float:
    """CPU seconds of scoring a stream when every lookup is already in the session's n-gram
    table: each sentence's lookups scored once untimed, then again timed (all hits).  What
    a lookup costs when nothing is computed: the floor of any exact n-gram-level cache."""
    ctx, words, starts = stream
    bounds = list(starts) + [len(words)]
    t = 0.0
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        scorer.begin(k)
        scorer.score_padded(ctx[a:b], words[a:b])
        t0 = time.process_time()
        scorer.score_padded(ctx[a:b], words[a:b])
        t += time.process_time() - t0
        scorer.end()
    return t


def _cached_pass(model, stream, directory: str, repeats: int, max_bytes: int = 0):
    """The least of ``repeats`` passes of a stream through the persistent cache (bounded by
    ``max_bytes``, 0: the default), each on a copy of ``directory`` as the iteration found it
    (as the passes without the cache are the least of ``repeats``: one pass of this machine can
    be 30% off); ``directory`` then holds what the last pass left (every pass writes the same
    entries).  Returns the times, the digest and the sentences that found files."""
    from nlmfeature._pcache import CachedScorer
    best = None
    for _ in range(max(1, repeats)):
        run = directory + ".run"
        if os.path.exists(run):
            shutil.rmtree(run)
        if os.path.exists(directory):
            shutil.copytree(directory, run)
        scorer = CachedScorer(model, run, max_bytes=max_bytes, quiet=True, policy="always", position_terms=True)
        got = _loop_pass(scorer, stream)
        found = scorer.stats()["files_read"]
        del scorer
        if best is None or sum(got[0]) < sum(best[0]):
            best = got + (found,)
    if os.path.exists(directory):
        shutil.rmtree(directory)
    os.rename(run, directory)
    return best


def _sentence_keys(stream) -> List[set]:
    """Per sentence: its distinct n-grams (context ids and word, as bytes)."""
    ctx, words, starts = stream
    rows = np.ascontiguousarray(np.concatenate([ctx, words[:, None]], axis=1), dtype=np.int32)
    bounds = list(starts) + [len(words)]
    return [set(r.tobytes() for r in rows[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def tuning_loop(model, streams: List[str], directory: str, repeats: int, out=sys.stdout,
                max_bytes: int = 0) -> dict:
    """Replay ``streams`` as the iterations of a tuning loop with and without the persistent
    cache in ``directory`` (emptied first, bounded by ``max_bytes``, 0: the default); the
    figures as a dict (also printed).  The bound assumes every n-gram of the iterations before
    is on disk: under a disk bound smaller than that, fewer are."""
    from nlmfeature._pcache import CachedScorer
    loaded = [querylog.load_stream(p, model, 0) for p in streams]
    if os.path.exists(directory):
        shutil.rmtree(directory)
    rows = []
    seen: List[set] = []  # per sentence: the n-grams of the iterations before (what the files can hold)
    first: List[set] = []  # per sentence: the first iteration's (what files kept as first written hold)
    last: List[set] = []  # per sentence: the iteration before's (what its working set holds)
    for i, stream in enumerate(loaded + loaded[-1:]):
        none = min((_loop_pass(CachedScorer(model, None, quiet=True, position_terms=True), stream) for _ in range(max(1, repeats))),
                   key=lambda r: sum(r[0]))
        hits = min(_hits_pass(CachedScorer(model, None, quiet=True, position_terms=True), stream) for _ in range(max(1, repeats)))
        keys = _sentence_keys(stream)
        distinct = sum(len(k) for k in keys)
        on_disk = sum(len(k & seen[j]) for j, k in enumerate(keys) if j < len(seen))
        share = on_disk / max(1, distinct)
        in_first = sum(len(k & first[j]) for j, k in enumerate(keys) if j < len(first)) / max(1, distinct)
        in_last = sum(len(k & last[j]) for j, k in enumerate(keys) if j < len(last)) / max(1, distinct)
        # the best any exact n-gram-level cache can do: every lookup costs a hit of the
        # session's table, and only the n-grams on disk are not computed
        bound = (hits + (1 - share) * max(0.0, sum(none[0]) - hits)) / max(1e-9, sum(none[0]))
        for j, k in enumerate(keys):
            if j < len(seen):
                seen[j] |= k
            else:
                seen.append(set(k))
        if not first:
            first = [set(k) for k in keys]
        last = keys
        cached = _cached_pass(model, stream, directory, repeats, max_bytes)
        row = {"iteration": i + 1 if i < len(loaded) else "unchanged", "lookups": int(len(stream[1])),
               "none_s": round(sum(none[0]), 3), "cache_s": round(sum(cached[0]), 3),
               "begin_s": round(cached[0][0], 3), "score_s": round(cached[0][1], 3),
               "end_s": round(cached[0][2], 3), "ratio": round(sum(cached[0]) / max(1e-9, sum(none[0])), 3),
               "same_scores": none[1] == cached[1], "disk_bytes": _dir_bytes(directory),
               "all_hits_s": round(hits, 3), "distinct_ngrams_on_disk": round(share, 3),
               "distinct_ngrams_in_first": round(in_first, 3), "distinct_ngrams_in_last": round(in_last, 3),
               "files_read": cached[2], "sentences": len(keys),
               "bound": round(bound, 3)}
        rows.append(row)
        print(f"iteration {row['iteration']}: {row['lookups']:,} lookups; no cache {row['none_s']:.2f} s, "
              f"cache {row['cache_s']:.2f} s (begin {row['begin_s']:.2f}, score {row['score_s']:.2f}, "
              f"end {row['end_s']:.2f}): {row['ratio']:.2f}x; {'same' if row['same_scores'] else 'DIFFERENT'} "
              f"scores; disk {row['disk_bytes'] / 1e6:.1f} MB ({row['files_read']} files read for "
              f"{row['sentences']} sentences); {row['distinct_ngrams_on_disk']:.1%} of its distinct n-grams "
              f"asked before ({row['distinct_ngrams_in_first']:.1%} in iteration 1, "
              f"{row['distinct_ngrams_in_last']:.1%} in the last), all lookups as hits {row['all_hits_s']:.2f} s: "
              f"bound {row['bound']:.2f}x", file=out, flush=True)
    later = rows[1:-1]
    summary = {"rows": rows}
    if later:
        none_s = max(1e-9, sum(r["none_s"] for r in later))
        summary["iterations_2_k_ratio"] = round(sum(r["cache_s"] for r in later) / none_s, 3)
        summary["iterations_2_k_bound"] = round(sum(r["bound"] * r["none_s"] for r in later) / none_s, 3)
        print(f"iterations 2-{len(loaded)}: {summary['iterations_2_k_ratio']:.2f}x of the scorer's cost without "
              f"the cache (bound {summary['iterations_2_k_bound']:.2f}x); unchanged weights {rows[-1]['ratio']:.2f}x "
              f"(bound {rows[-1]['bound']:.2f}x)", file=out)
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="model file (.nlm)")
    ap.add_argument("--stream", action="append", default=None,
                    help="packed query log (.qlog.xz; default: the bundled Moses stream); repeat it with "
                         "--persistent-cache, one per tuning iteration")
    ap.add_argument("--sentences", type=int, default=0, help="replay the first N sentences (default 0: all)")
    ap.add_argument("--repeats", type=int, default=3, help="replays; the fastest is reported (default 3)")
    ap.add_argument("--ngram-entries", type=int, default=None,
                    help="bound of the session's n-gram cache (default: the session's own default; 0 off)")
    ap.add_argument("--save", default=None, help="write every score to this .npy file")
    ap.add_argument("--persistent-cache", default=None, metavar="DIR",
                    help="replay the streams as a tuning loop with and without the persistent cache in DIR "
                         "(emptied first)")
    ap.add_argument("--max-bytes", default="0", metavar="SIZE", type=size_bytes,
                    help="with --persistent-cache: bound of the cache directory (500M, 2G, ...; default 0: "
                         "the cache's own default, 4G)")
    ap.add_argument("--json", default=None, help="with --persistent-cache: write the figures to this file")
    args = ap.parse_args(argv)
    model = nlmfeature.load(args.model)
    if args.persistent_cache:
        summary = tuning_loop(model, args.stream or [None], args.persistent_cache, args.repeats,
                              max_bytes=int(args.max_bytes))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)
        return 0 if all(r["same_scores"] for r in summary["rows"]) else 1
    if args.stream and len(args.stream) > 1:
        ap.error("several --stream are a tuning loop: give --persistent-cache DIR")
    ctx, words, starts = querylog.load_stream(args.stream[0] if args.stream else None, model, args.sentences)
    bounds = list(starts) + [len(words)]
    # a decoder's session (normalisers from position terms, as the C API's sessions)
    opts = {"position_terms": True} if args.ngram_entries is None else \
        {"ngram_entries": args.ngram_entries, "position_terms": True}
    best, out = float("inf"), None
    for _ in range(max(1, args.repeats)):
        session = model.session(**opts)
        parts = []
        t0 = time.process_time()
        for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            session.begin_sentence(k)
            parts.append(session.score_padded(ctx[a:b], words[a:b]))
        best = min(best, time.process_time() - t0)
        out = np.concatenate(parts)
    if args.save:
        np.save(args.save, out)
    print(f"{os.path.basename(args.model)}: {len(words)} lookups in {len(bounds) - 1} sentences, "
          f"{best / max(1, len(words)) * 1e9:.1f} CPU ns/lookup, scores sha1 {_digest(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
