#!/usr/bin/env python3
"""Replay a decoder's query log through one model's native session: CPU ns per lookup and a
digest of every score (scorer changes that must keep scores bit-identical are checked by the
digest; speed levers by the ns/lookup, paired: run before and after in turn).

Record a log with ``NLMFEATURE_QUERY_LOG=DIR`` in a decoder's environment and pack it with
``nlmfeature querylog pack DIR/queries.PID.N.bin --model MODEL --out X.qlog.xz``
(docs/c-api.md); without ``--stream`` the bundled Moses stream is replayed.  Example (the
figures of docs/decoder-speed.md, session 4)::

    python3 tools/replay_querylog.py class.nlm --stream m30k-class.qlog.xz --repeats 3
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
import numpy as np  # noqa: E402

import nlmfeature  # noqa: E402
from nlmfeature.decoder import querylog  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="model file (.nlm)")
    ap.add_argument("--stream", default=None, help="packed query log (.qlog.xz; default: the bundled Moses stream)")
    ap.add_argument("--sentences", type=int, default=0, help="replay the first N sentences (default 0: all)")
    ap.add_argument("--repeats", type=int, default=3, help="replays; the fastest is reported (default 3)")
    ap.add_argument("--ngram-entries", type=int, default=None,
                    help="bound of the session's n-gram cache (default: the session's own default; 0 off)")
    ap.add_argument("--save", default=None, help="write every score to this .npy file")
    args = ap.parse_args(argv)
    model = nlmfeature.load(args.model)
    ctx, words, starts = querylog.load_stream(args.stream, model, args.sentences)
    bounds = list(starts) + [len(words)]
    opts = {} if args.ngram_entries is None else {"ngram_entries": args.ngram_entries}
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
          f"{best / max(1, len(words)) * 1e9:.1f} CPU ns/lookup, scores sha1 {hashlib.sha1(out.tobytes()).hexdigest()[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
