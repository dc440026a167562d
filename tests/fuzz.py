#!/usr/bin/env python3
"""Fuzz the decoder boundary: deterministic, seeded mutations of real seed files, each case
run in a worker subprocess under a time limit, through the Python API and the C API.

    python3 tests/fuzz.py --minutes 20               # long run, all input kinds
    python3 tests/fuzz.py --cases 80 --seed 7        # a bounded run, as tests/test_fuzz.py does
    python3 tests/fuzz.py --replay tests/data/fuzz   # re-run stored cases (fixtures)

Input kinds and what a case checks:

* ``model``  a model file (Brown-vocabulary models of every output type, direct features,
  lateral branches, and a joint model with a source vocabulary and window) with a mutated
  header value, integer array (vocab.hash, offsets, class and tree arrays), float or raw
  byte -- the checksum recomputed so the mutation reaches the checks behind it.  Loading
  must give a ``ModelFileError`` naming the file, or load; then the native scorer
  (sessions), the batched matrix scorer, the persistent-cache scorer and the float64
  reference (tests/reference.py) must agree (joint models: native and batched scores of
  real Multi30k triples, and of the ``<null>`` window).
* ``capi``   the same mutated model files through ``tests/c/test_capi.c`` (the C API): a file
  Python refuses must give ``NLM_ERR_MODEL`` naming it; a file Python loads must give the
  same scores from 2 threads.
* ``nplm``   a mutated NPLM text model: ``read_nplm`` must give an ``InputError`` naming the
  file, or a model whose scorers agree.
* ``kbest``  a mutated k-best list (real Moses and cdec lists, plain and gzip): reading and
  rescoring must give an ``InputError`` naming the file, or finish.
* ``pcache`` a mutated persistent-cache file (half of them changed in their structure and
  sealed again with valid checksums, as a hostile directory could), or (a quarter of them) a
  valid one rewritten in place with the mutation after the sentence began (shorter, longer,
  scribbled over): the cached scorer must ignore it (warning) and score exactly as the model, or (resealed)
  read it as written, never crash or hang.

Outcomes per case: ``ok`` (accepted, scores agree), ``clear`` (the expected error class,
naming the file), ``unclear`` (another exception: a traceback for the user), ``wrong`` (the
scorers disagree), ``crash`` (the worker died: signal, abort) and ``hang`` (time limit).
Every case that is not ok/clear is copied to ``WORKDIR/failures`` with a JSON note; cases
that once failed are kept in tests/data/fuzz/ and replayed by the test suite.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests")
KINDS = ("model", "capi", "nplm", "kbest", "pcache")
OUTCOMES = ("ok", "clear", "unclear", "wrong", "crash", "hang")
FAILURES = ("unclear", "wrong", "crash", "hang")
INTERESTING_INTS = [0, -1, 1, 2, 3, 4, 5, 16, 17, 255, 1 << 15, (1 << 31) - 1, 1 << 31, -(1 << 31),
                    (1 << 32) + 1, (1 << 62), -(1 << 63), 10 ** 12]
INTERESTING_VALUES = [None, True, False, "4", "", "x" * 300, [], {}, [[]], {"a": 1}, 1.5, -0.0,
                      1e308, float("inf"), float("nan")]


def _paths():
    for p in (TESTS, HERE, os.path.join(ROOT, "src")):
        if p not in sys.path:
            sys.path.insert(0, p)


# ---------------------------------------------------------------------------------------
# seeds (real files: Brown-vocabulary models, NPLM export, real k-best lists, cache files)
# ---------------------------------------------------------------------------------------

MODEL_SEEDS = {
    "lbl-unnorm-tables": dict(order=4),
    "nplm-softmax": dict(arch="nplm", order=4, word_width=8, hidden=12, hidden_layers=[8],
                         output="softmax", tables=False),
    "lbl-class-direct": dict(order=4, output="class", classes=9, direct_order=2, hash_space=101,
                             diagonal_contexts=False, word_width=8),
    "lbl-tree": dict(order=3, output="tree", word_width=8),
    "lateral-mul": dict(arch="lateral", order=3, word_width=8, hidden=8, branches=2, combine="mul",
                        hidden_layers=[6], layer_activation="relu"),
}


def make_seeds(workdir: str) -> Dict[str, Any]:
    """Write the seed files into ``workdir/seeds`` (deterministic); returns their index."""
    _paths()
    import numpy as np  # noqa: F401
    import nlmfeature
    from helpers import BROWN_VALID, make_model, read_lines
    from nlmfeature.core import modelfile
    from nlmfeature.training.nplm import write_nplm
    from nlmfeature.decoder.pcache import CachedScorer

    d = os.path.join(workdir, "seeds")
    index_path = os.path.join(d, "index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            return json.load(f)
    os.makedirs(d, exist_ok=True)
    idx: Dict[str, Any] = {"model": [], "nplm": [], "kbest": [], "pcache": []}
    for name, fields in MODEL_SEEDS.items():
        fields = dict(fields)
        tables = fields.pop("tables", True)
        idx["model"].append(make_model(d, f"{name}.nlm", tables=tables, min_count=8, seed=len(idx["model"]),
                                       **fields))
    idx["model"].append(_joint_seed(d))
    idx["joint_text"] = [os.path.join(ROOT, "tests", "data", "multi30k", f"test2016.200.{k}")
                         for k in ("de", "en", "align")]
    text = os.path.join(d, "text.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(read_lines(BROWN_VALID, 6)) + "\n")
    idx["text"] = text
    for layers in ([10], []):
        src = make_model(d, f"nplm-src{len(layers)}.nlm", arch="nplm", order=4, word_width=6, hidden=10,
                         hidden_layers=layers, tables=False, min_count=12)
        h, a, _ = modelfile.read_model(src)
        out = os.path.join(d, f"model{len(layers)}.nplm")
        write_nplm(out, h, a, list(nlmfeature.load(src).vocab))
        idx["nplm"].append(out)
    kb = os.path.join(ROOT, "tests", "data", "kbest")
    with gzip.open(os.path.join(kb, "moses-multi30k-dev10.100best.gz"), "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(120)]
    plain = os.path.join(d, "moses.kbest")
    with open(plain, "w", encoding="utf-8") as f:
        f.writelines(lines)
    gz = os.path.join(d, "moses.kbest.gz")
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.writelines(lines[:60])
    cdec = os.path.join(d, "cdec.kbest")
    shutil.copy(os.path.join(kb, "cdec-lattice.kbest"), cdec)
    idx["kbest"] = [plain, gz, cdec]
    m = nlmfeature.load(idx["model"][0])
    pc = os.path.join(d, "pcache")
    cs = CachedScorer(m, directory=pc, quiet=True, policy="always")
    for i, line in enumerate(read_lines(text)[:3]):
        cs.begin(i)
        cs.score_sentence(line)
        cs.end()
    for i in range(3):
        idx["pcache"].append(os.path.join(cs.directory, f"{i}.nlmc"))
    idx["pcache_model"] = idx["model"][0]
    with open(index_path, "w") as f:
        json.dump(idx, f)
    return idx


def _joint_seed(d: str) -> str:
    """A joint model (NNJM, window 5, class output, precomputed tables for target and source
    positions) on the vocabularies of the bundled Multi30k slice."""
    import nlmfeature
    from nlmfeature.core.architecture import ModelSpec, precompute_tables, random_model
    from nlmfeature.core.joint import read_parallel
    from nlmfeature.training.corpus import build_vocabulary

    m30k = os.path.join(ROOT, "tests", "data", "multi30k")
    srcs, tgts, _ = read_parallel(*(os.path.join(m30k, f"train.3k.{k}.gz") for k in ("de", "en", "align")))
    tv, tc = build_vocabulary(tgts[:600], 3)
    sv, sc = build_vocabulary(srcs[:600], 3)
    header, arrays = random_model(ModelSpec(arch="lbl", order=4, word_width=12, hidden=12, output="class",
                                            classes=7, diagonal_contexts=True, source_window=5),
                                  tv, tc, seed=5, scale=0.3, source_vocab=sv, source_counts=sc)
    precompute_tables(header, arrays, diagonal=True)
    path = os.path.join(d, "joint-class-tables.nlm")
    nlmfeature.save(path, header, arrays)
    return path


# ---------------------------------------------------------------------------------------
# mutations (all decided by random.Random(case seed): a case id reproduces its input)
# ---------------------------------------------------------------------------------------

def _json_paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _json_paths(v, prefix + (i,))


def _mutate_value(rng: random.Random, v):
    r = rng.random()
    if isinstance(v, bool) or not isinstance(v, int):
        return rng.choice(INTERESTING_INTS + INTERESTING_VALUES)
    if r < 0.5:
        return v + rng.choice([-2, -1, 1, 2, 64, -64])
    if r < 0.8:
        return rng.choice(INTERESTING_INTS)
    return rng.choice([str(v), float(v), None, [v], {"v": v}, v * 2])


def mutate_model(rng: random.Random, raw: bytes) -> (bytes, str):
    import numpy as np
    import modelbytes
    h = modelbytes.header_of(raw)
    op = rng.choices(["header", "intarray", "floatarray", "bytes", "preamble"], [35, 35, 8, 17, 5])[0]
    if op == "header":
        paths = [p for p in _json_paths(h) if p and p[0] != "metadata"]
        path = rng.choice(paths)
        r = rng.random()

        def change(hh):
            parent = hh
            for k in path[:-1]:
                parent = parent[k]
            if r < 0.12 and isinstance(parent, dict):
                del parent[path[-1]]
            elif r < 0.16:
                parent[path[-1]] = json.loads("[" * 50 + "]" * 50)
            else:
                parent[path[-1]] = _mutate_value(rng, parent[path[-1]])
        if rng.random() < 0.03:
            depth = rng.choice([64, 5000, 200000])
            return modelbytes.rewrite(raw, header_bytes=b"[" * depth + b"]" * depth), f"header nested {depth}"
        return modelbytes.rewrite(raw, change_header=change), f"header {'/'.join(map(str, path))}"
    if op in ("intarray", "floatarray"):
        kind = "iu" if op == "intarray" else "f"
        names = sorted(n for n, e in h["arrays"].items() if np.dtype(e["dtype"]).kind in kind and e["nbytes"])
        name = rng.choice(names)
        e = h["arrays"][name]
        dt = np.dtype(e["dtype"])
        how = rng.choice(["set", "set", "set", "swap", "reverse", "fill", "shift"]) if op == "intarray" \
            else rng.choice(["nan", "inf", "huge", "set"])

        def edit(buf, ent):
            a = np.frombuffer(buf, dtype=dt, count=ent["nbytes"] // dt.itemsize, offset=ent["start"]).copy()
            n = len(a)
            i, j = rng.randrange(n), rng.randrange(n)
            if how == "set":
                vals = [0, -1, 1, 2, 3, n - 1, n, n + 1, (1 << 31) - 1, -(1 << 31), rng.randrange(-n, 2 * n + 1)]
                if dt.kind == "f":
                    vals = [0.0, -1e30, 1e30, rng.uniform(-10, 10)]
                for _ in range(rng.choice([1, 1, 2, 3])):
                    a[rng.randrange(n)] = np.array(rng.choice(vals)).astype(dt)
            elif how == "swap":
                a[i], a[j] = a[j], a[i]
            elif how == "reverse":
                lo, hi = sorted((i, j))
                a[lo:hi + 1] = a[lo:hi + 1][::-1].copy()
            elif how == "fill":
                lo, hi = sorted((i, j))
                a[lo:hi + 1] = np.array(rng.choice([-1, 0, 1])).astype(dt)
            elif how == "shift":
                a[:] = (a.astype(np.int64) + rng.choice([-1, 1])).astype(dt)
            elif how == "nan":
                a[i] = np.nan
            elif how == "inf":
                a[i] = rng.choice([np.inf, -np.inf])
            elif how == "huge":
                a[i] = rng.choice([3e38, -3e38, 1e20])
            buf[ent["start"]:ent["start"] + ent["nbytes"]] = a.tobytes()
        return modelbytes.rewrite(raw, arrays={name: edit}), f"{op} {name} {how}"
    if op == "bytes":
        fields, hdr, tail = modelbytes.split(raw)
        body = bytearray(hdr + tail)
        for _ in range(rng.choice([1, 1, 2, 8])):
            pos = rng.randrange(len(body)) if rng.random() < 0.5 else rng.randrange(min(len(body), len(hdr) + 256))
            body[pos] = rng.randrange(256)
        return modelbytes.seal(fields, bytes(body[:len(hdr)]), bytes(body[len(hdr):])), "bytes (resealed)"
    buf = bytearray(raw)
    pos = rng.randrange(64)
    buf[pos] = rng.randrange(256)
    if rng.random() < 0.3:
        buf = buf[:rng.randrange(len(buf))]
    return bytes(buf), f"preamble byte {pos}"


NPLM_TOKENS = ["nan", "inf", "-inf", "1e400", "1e39", "-0", "abc", "99999999999", "1000000000", "", "0",
               "-5", "3.5", "\u00e9", "\xff"]


def mutate_text(rng: random.Random, text: str, kind: str) -> (str, str):
    lines = text.split("\n")
    op = rng.choice(["token", "token", "token", "delete", "duplicate", "swap", "blank", "truncate",
                     "columns", "garbage"] + (["config"] * 3 if kind == "nplm" else ["id", "sep"]))
    i = rng.randrange(len(lines))
    if op == "config" and kind == "nplm":
        cfg = [k for k, l in enumerate(lines[:12]) if len(l.split()) == 2]
        i = rng.choice(cfg)
        key = lines[i].split()[0]
        lines[i] = f"{key} {rng.choice(NPLM_TOKENS + [str(x) for x in INTERESTING_INTS])}"
    elif op == "token":
        toks = lines[i].split(" ") if " " in lines[i] else lines[i].split("\t")
        j = rng.randrange(len(toks))
        toks[j] = rng.choice(NPLM_TOKENS)
        lines[i] = (" " if " " in lines[i] else "\t").join(toks)
    elif op == "delete":
        del lines[i]
    elif op == "duplicate":
        lines.insert(i, lines[i])
    elif op == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "blank":
        lines.insert(i, "")
    elif op == "truncate":
        return text[:rng.randrange(len(text))], "truncate"
    elif op == "columns":
        lines[i] = lines[i] + rng.choice([" 0", "\t1.5", " ||| x", " x=nan"])
    elif op == "garbage":
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)] + rng.choice(["\x00", "\ufffd", "\u2028", "\r"])
    elif op == "id":
        parts = lines[i].split(" ||| ")
        parts[0] = rng.choice(["1000000000000", "-1", "x", "99999", "0.5", ""])
        lines[i] = " ||| ".join(parts)
    elif op == "sep":
        lines[i] = lines[i].replace(" ||| ", rng.choice([" || ", " |||| ", " "]), 1)
    return "\n".join(lines), f"{op} line {i + 1}"


def mutate_bytes(rng: random.Random, raw: bytes) -> (bytes, str):
    b = bytearray(raw)
    op = rng.choice(["flip", "flip", "truncate", "extend", "count", "empty"])
    if op == "flip":
        for _ in range(rng.choice([1, 2, 4])):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif op == "truncate":
        b = b[:rng.randrange(len(b))]
    elif op == "extend":
        b += bytes(rng.randrange(1, 200))
    elif op == "count":
        pos = rng.randrange(8, min(64, len(b)) - 8)
        b[pos:pos + 8] = rng.choice(INTERESTING_INTS).to_bytes(8, "little", signed=True)
    else:
        b = bytearray()
    return bytes(b), op


def mutate_pcache(rng: random.Random, raw: bytes) -> (bytes, str):
    """A cache file changed where its structure is (the region descriptors and filter sizes of
    the header, the slot maps, keys and values) and sealed again with both of its checksums:
    what a hostile directory can hold (the checksums are not secret), so that the checks
    behind them (sizes, slot maps against entry counts) are what refuses it."""
    from nlmfeature._pcache import data_checksum, header_checksum
    b = bytearray(raw)
    if len(b) < 192:
        return mutate_bytes(rng, raw)
    op = rng.choice(["descriptor", "descriptor", "count", "body", "body"])
    if op == "descriptor":  # bytes 40..183: key length, width, doubles, slots, entries, probe, filters
        for _ in range(rng.choice([1, 1, 2])):
            b[rng.randrange(40, 184) if rng.random() < 0.5 else rng.randrange(40, 136)] = rng.randrange(256)
    elif op == "count":
        pos = rng.choice([48, 56, 64, 80, 88, 96, 112, 120, 128, 144, 152, 160])
        b[pos:pos + 8] = rng.choice(INTERESTING_INTS).to_bytes(8, "little", signed=True)
    else:  # slot maps, keys, values, filters
        for _ in range(rng.choice([1, 2, 8])):
            if len(b) > 192:
                b[rng.randrange(192, len(b))] ^= 1 << rng.randrange(8)
    b[136:144] = data_checksum(bytes(b[192:])).to_bytes(8, "little")
    b[184:192] = header_checksum(bytes(b[:184])).to_bytes(8, "little")
    return bytes(b), f"{op} (resealed)"


def make_case(seeds: Dict[str, Any], case_id: int, run_seed: int, kinds, casedir: str,
              special: bool = False) -> Dict[str, Any]:
    """Write case ``case_id``'s input file; returns its description (for the worker)."""
    _paths()
    rng = random.Random(run_seed * 1_000_003 + case_id)
    kind = kinds[case_id % len(kinds)]
    case: Dict[str, Any] = {"id": case_id, "kind": kind, "seed": run_seed, "text": seeds["text"],
                            "joint_text": seeds["joint_text"]}
    if kind in ("model", "capi"):
        src = rng.choice(seeds["model"])
        with open(src, "rb") as f:
            data, what = mutate_model(rng, f.read())
        ext = ".nlm"
    elif kind == "nplm":
        src = rng.choice(seeds["nplm"])
        with open(src, encoding="utf-8") as f:
            text, what = mutate_text(rng, f.read(), "nplm")
        data, ext = text.encode("utf-8", "surrogatepass"), ".nplm"
    elif kind == "kbest":
        src = rng.choice(seeds["kbest"])
        if src.endswith(".gz"):
            with open(src, "rb") as f:
                raw = f.read()
            if rng.random() < 0.5:
                data, what = mutate_bytes(rng, raw)
                what = "gzip " + what
            else:
                text, what = mutate_text(rng, gzip.decompress(raw).decode("utf-8"), "kbest")
                data = gzip.compress(text.encode("utf-8", "surrogatepass"), mtime=0)
            ext = ".kbest.gz"
        else:
            with open(src, encoding="utf-8") as f:
                text, what = mutate_text(rng, f.read(), "kbest")
            data, ext = text.encode("utf-8", "surrogatepass"), ".kbest"
    else:
        k = rng.randrange(len(seeds["pcache"]))
        src = seeds["pcache"][k]
        with open(src, "rb") as f:
            raw = f.read()
        if rng.random() < 0.5:
            data, what = mutate_pcache(rng, raw)
            case["resealed"] = True
        else:
            data, what = mutate_bytes(rng, raw)
        case["sentence"] = k
        case["model"] = seeds["pcache_model"]
        ext = ".nlmc"
        if special and rng.random() < 0.03:  # a FIFO, a directory or a 3 GB sparse file instead
            case["special"] = what = rng.choice(["fifo", "directory", "huge"])
        elif rng.random() < 0.25:  # the valid file at sentence begin, mutated in place while in use
            case["in_use"] = src
            what = "in use, then " + what
    path = os.path.join(casedir, f"{case_id}-{kind}{ext}")
    with open(path, "wb") as f:
        f.write(data)
    case.update(path=path, source=os.path.basename(src), mutation=what)
    return case


# ---------------------------------------------------------------------------------------
# the worker: runs cases one by one, reports each outcome on stdout
# ---------------------------------------------------------------------------------------

class _Checker:
    def __init__(self, capi_exe: Optional[str]) -> None:
        _paths()
        import numpy as np
        import nlmfeature
        from nlmfeature.errors import InputError, ModelFileError, NLMFeatureError
        self.np, self.nlm, self.capi = np, nlmfeature, capi_exe
        self.InputError, self.ModelFileError, self.NLMFeatureError = InputError, ModelFileError, NLMFeatureError

    def _lines(self, case):
        with open(case["text"], encoding="utf-8") as f:
            return [l.strip() for l in f][:4]

    @staticmethod
    def _agree(np, a, b, tol=2e-4):
        """Scores agree where the reference is finite and moderate (mutated weights may push
        float32 to overflow where float64 does not: no verdict there)."""
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            return False
        m = np.isfinite(b) & (np.abs(b) < 1e4)
        return bool(np.all(np.isfinite(a[m])) and np.allclose(a[m], b[m], rtol=tol, atol=tol))

    def scorers_agree(self, m, lines, reference=True) -> Optional[str]:
        np = self.np
        from reference import logprob
        from nlmfeature.decoder.pcache import CachedScorer
        cs = CachedScorer(m)
        for k, line in enumerate(lines):
            native = m.score_sentence(line)
            ctx, words = m.sentence_ngrams(line)
            batched = m.score_batch(ctx, words)
            cs.begin(k)
            cached = cs.score_sentence(line)
            cs.end()
            if not np.array_equal(native, cached, equal_nan=True):
                return f"sentence {k}: native {native[:4]} != cached {cached[:4]}"
            if not self._agree(np, native, batched):
                return f"sentence {k}: native {native[:4]} != batched {batched[:4]}"
            if reference and k < 2:
                idx = list(range(0, len(words), max(1, len(words) // 4)))[:4]
                ref = [logprob(m.header, m.arrays, [int(x) for x in ctx[i]], int(words[i])) for i in idx]
                if not self._agree(np, native[idx], ref, 1e-3):
                    return f"sentence {k}: native {native[idx]} != reference {ref}"
        return None

    def model(self, case) -> Dict[str, Any]:
        try:
            m = self.nlm.load(case["path"])
        except self.ModelFileError as exc:
            return self._clear(exc, case)
        if m.header.get("source"):
            bad = self.joint_scorers_agree(m, case)
        else:
            bad = self.scorers_agree(m, self._lines(case))
        return {"outcome": "wrong", "detail": bad} if bad else {"outcome": "ok"}

    def joint_scorers_agree(self, m, case) -> Optional[str]:
        """A joint model: native (one lookup at a time, through the caches) against batched
        scores of real (source, target, alignment) triples, and the <null>-window scores
        of target-only calls against batched ones."""
        np = self.np
        files = [open(p, encoding="utf-8") for p in case["joint_text"]]
        try:
            rows = [tuple(l.strip() for l in t) for _, t in zip(range(3), zip(*files))]
        finally:
            for f in files:
                f.close()
        for k, (src, tgt, al) in enumerate(rows):
            native = m.score_sentence(src, tgt, al)
            ctx, words = m.sentence_ngrams(src, tgt, al)
            if not self._agree(np, native, m.score_batch(ctx, words)):
                return f"joint sentence {k}: native {native[:4]} != batched"
            toks = tgt.split()
            nulls = [m.score_ngram(["<s>"] + toks[:i], w) for i, w in enumerate(toks + ["</s>"])]
            ctx[:, :m.native.source_window] = m.source_vocab.null
            if not self._agree(np, nulls, m.score_batch(ctx, words)):
                return f"joint sentence {k}: <null>-window native {nulls[:4]} != batched"
        return None

    def capi_case(self, case) -> Dict[str, Any]:
        np = self.np
        try:
            m = self.nlm.load(case["path"])
        except self.ModelFileError:
            m = None
        if m is None:
            p = self._run([self.capi, "load", case["path"]])
            if isinstance(p, dict):
                return p
            if "status=-2" in p.stdout and case["path"] in p.stdout:
                return {"outcome": "clear", "detail": p.stdout.strip()[-160:]}
            return {"outcome": "unclear", "detail": f"C API: {p.stdout.strip()[-300:]} {p.stderr[-300:]}"}
        p = self._run([self.capi, "score", case["path"], case["text"], "--threads", "2"])
        if isinstance(p, dict):
            return p
        if p.returncode != 0:
            return {"outcome": "unclear", "detail": f"C API exit {p.returncode}: {p.stderr[-300:]}"}
        got = [[float(x) for x in l.split()] for l in p.stdout.splitlines()]
        # Python scoring as the C API's sessions do (a decoder's: normalisers of log-bilinear
        # models from position terms), so that the two must agree however wild the weights
        m._session = m.session(position_terms=True)
        with open(case["text"], encoding="utf-8") as f:
            if m.header.get("source"):  # nlm_score on a joint model: the <null> window
                want = [[m.score_ngram(["<s>"] + t[:i], w) for i, w in enumerate(t + ["</s>"])]
                        for t in (l.split() for l in f)]
            else:
                want = [m.score_sentence(l.strip()) for l in f]
        if len(got) != len(want) or any(not np.allclose(a, b, atol=1e-6, equal_nan=True) for a, b in zip(got, want)):
            return {"outcome": "wrong", "detail": "C API scores differ from Python's"}
        return {"outcome": "ok"}

    def _run(self, cmd):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, errors="replace")
        except subprocess.TimeoutExpired:
            return {"outcome": "hang", "detail": "C program: time limit"}
        if p.returncode < 0:
            return {"outcome": "crash", "detail": f"C program died with signal {-p.returncode}: {p.stderr[-300:]}"}
        return p

    def nplm(self, case) -> Dict[str, Any]:
        from nlmfeature.training.nplm import read_nplm
        try:
            header, arrays = read_nplm(case["path"])
            out = case["path"] + ".nlm"
            self.nlm.save(out, header, arrays)
        except (self.InputError, self.ModelFileError) as exc:
            return self._clear(exc, case)
        m = self.nlm.load(out)
        if m.header["special"] != {"<unk>": 0, "<s>": 1, "</s>": 2, "<null>": 3}:
            return {"outcome": "wrong", "detail": f"special ids {m.header['special']}"}
        bad = self.scorers_agree(m, self._lines(case))
        return {"outcome": "wrong", "detail": bad} if bad else {"outcome": "ok"}

    def kbest(self, case) -> Dict[str, Any]:
        from nlmfeature.mt.kbest import read_kbest
        from nlmfeature.mt.rescore import rescore
        try:
            n = sum(1 for _ in read_kbest(case["path"]))
            out = case["path"] + ".out.gz"
            rescore(case["path"], out, [case.get("rescore_model") or self._model0(case)], progress=False,
                    log=lambda msg: None)
        except self.NLMFeatureError as exc:
            return self._clear(exc, case)
        return {"outcome": "ok", "detail": f"{n} hypotheses"}

    def _model0(self, case):
        with open(os.path.join(os.path.dirname(case["text"]), "index.json")) as f:
            return json.load(f)["model"][0]

    def pcache(self, case) -> Dict[str, Any]:
        np = self.np
        from nlmfeature.decoder.pcache import CachedScorer
        m = self.nlm.load(case["model"])
        d = case["path"] + ".dir"
        shutil.rmtree(d, ignore_errors=True)
        sub = os.path.join(d, m.checksum)
        os.makedirs(sub)
        target = os.path.join(sub, f"{case['sentence']}.nlmc")
        special = case.get("special")
        if special == "fifo":
            os.mkfifo(target)
        elif special == "directory":
            os.mkdir(target)
        elif special == "huge":
            with open(target, "wb") as f:
                f.truncate(3 << 30)
        else:
            shutil.copy(case.get("in_use") or case["path"], target)
        cs = CachedScorer(m, directory=d, quiet=True, policy="always")
        line = self._lines(case)[case["sentence"]]
        cs.begin(case["sentence"])
        if case.get("in_use"):  # rewritten in place (same inode, maybe shorter) after begin
            with open(case["path"], "rb") as f:
                data = f.read()
            with open(target, "r+b") as f:
                f.write(data)
                f.truncate(len(data))
        got = cs.score_sentence(line)
        cs.end()
        want = m.score_sentence(line)
        if case.get("resealed"):
            # valid checksums: a file whose values were changed is read as written (a cache
            # cannot tell); what counts is that nothing crashed or hung
            return {"outcome": "ok"}
        if not np.array_equal(got, want):
            return {"outcome": "wrong", "detail": f"cached {got[:4]} != model {want[:4]}"}
        cs.begin(case["sentence"])  # the rewritten file reads back
        again = cs.score_sentence(line)
        cs.end()
        if not np.array_equal(again, want):
            return {"outcome": "wrong", "detail": "rewritten cache file gives other scores"}
        return {"outcome": "ok"}

    def _clear(self, exc, case) -> Dict[str, Any]:
        msg = str(exc)
        if case["path"] not in msg:
            return {"outcome": "unclear", "detail": f"error does not name the file: {msg[:300]}"}
        return {"outcome": "clear", "detail": msg[len(case["path"]):][:200]}

    def run(self, case) -> Dict[str, Any]:
        fn = {"model": self.model, "capi": self.capi_case, "nplm": self.nplm, "kbest": self.kbest,
              "pcache": self.pcache}[case["kind"]]
        try:
            return fn(case)
        except Exception as exc:  # noqa: BLE001 - any other exception is a finding
            tb = traceback.format_exc().strip().splitlines()
            return {"outcome": "unclear", "detail": f"{type(exc).__name__}: {str(exc)[:200]} | {' / '.join(tb[-3:])[:400]}"}


def worker(capi_exe: Optional[str]) -> int:
    checker = _Checker(capi_exe or None)
    print("READY", flush=True)
    for line in sys.stdin:
        case = json.loads(line)
        print(f"BEGIN {case['id']}", flush=True)
        res = checker.run(case)
        print("END " + json.dumps({"id": case["id"], **res}), flush=True)
    return 0


# ---------------------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------------------

class Pool:
    """One worker subprocess; restarted after a crash or a hang."""

    def __init__(self, capi_exe: str, timeout: float, env: Dict[str, str]) -> None:
        self.capi_exe, self.timeout, self.env = capi_exe, timeout, env
        self.proc: Optional[subprocess.Popen] = None

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--capi", self.capi_exe],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=self.env, start_new_session=True, cwd=ROOT)
        self.buf = b""
        line = self._readline(120)
        if line != "READY":
            raise RuntimeError(f"fuzz worker did not start: {line!r}")

    def _readline(self, timeout: float) -> Optional[str]:
        """The worker's next output line; None on time-out, "" when it died.  Reads the pipe
        unbuffered (a buffered reader would hide a second line from select)."""
        deadline = time.time() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.time()
            if left <= 0:
                return None
            sel = selectors.DefaultSelector()
            sel.register(fd, selectors.EVENT_READ)
            ready = sel.select(left)
            sel.close()
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return ""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode("utf-8", "replace")

    def kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            self.proc = None

    def run(self, case: Dict[str, Any]) -> Dict[str, Any]:
        if self.proc is None:
            self._start()
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        deadline = time.time() + self.timeout
        while True:
            line = self._readline(max(0.0, deadline - time.time()))
            if line is None:
                self.kill()
                return {"outcome": "hang", "detail": f"no result within {self.timeout:.0f} s"}
            if line == "":
                rc = self.proc.wait()
                self.proc = None
                return {"outcome": "crash", "detail": f"worker died ({'signal ' + str(-rc) if rc < 0 else 'exit ' + str(rc)})"}
            if line.startswith("END "):
                res = json.loads(line[4:])
                res.pop("id", None)
                return res


def build_capi(workdir: str) -> str:
    exe = os.path.join(workdir, "test_capi")
    if os.path.exists(exe):
        return exe
    flags = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "config", "--cflags", "--libs"],
                           capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    subprocess.run(["cc", "-O1", *[f for f in flags if not f.startswith("-l")],
                    os.path.join(TESTS, "c", "test_capi.c"), "-o", exe,
                    *[f for f in flags if f.startswith("-l")], "-lpthread", "-lm"], check=True)
    return exe


def summarise(results: List[Dict[str, Any]]) -> str:
    rows = ["kind     tried     ok  clear  unclear  wrong  crash  hang"]
    for kind in KINDS:
        rs = [r for r in results if r["kind"] == kind]
        if rs:
            c = {o: sum(r["outcome"] == o for r in rs) for o in OUTCOMES}
            rows.append(f"{kind:7s} {len(rs):6d} {c['ok']:6d} {c['clear']:6d} {c['unclear']:8d} {c['wrong']:6d} "
                        f"{c['crash']:6d} {c['hang']:5d}")
    return "\n".join(rows)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=0, help="run for this many minutes")
    ap.add_argument("--seconds", type=float, default=0, help="run for this many seconds (adds to --minutes)")
    ap.add_argument("--cases", type=int, default=0, help="stop after this many cases (0: time only)")
    ap.add_argument("--seed", type=int, default=1, help="run seed: the same seed gives the same cases")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"input kinds to fuzz (default: {','.join(KINDS)})")
    ap.add_argument("--timeout", type=float, default=30, help="time limit of one case in seconds (default 30)")
    ap.add_argument("--workdir", help="directory for seeds, cases and failures (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep every case file, not only failures")
    ap.add_argument("--special-files", action="store_true",
                    help="pcache cases also put a FIFO, a directory or a 3 GB sparse file where a cache file goes")
    ap.add_argument("--replay", metavar="DIR", help="run the stored cases (*.json notes) in DIR instead")
    ap.add_argument("--json", metavar="FILE", help="write the per-case results to FILE")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--capi", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.capi)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown kinds {sorted(unknown)}")
    budget = args.minutes * 60 + args.seconds
    if not budget and not args.cases and not args.replay:
        ap.error("give --minutes, --seconds, --cases or --replay")
    workdir = args.workdir or tempfile.mkdtemp(prefix="nlmfuzz-")
    os.makedirs(workdir, exist_ok=True)
    casedir = os.path.join(workdir, "cases")
    faildir = os.path.join(workdir, "failures")
    os.makedirs(casedir, exist_ok=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT, TESTS, HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    t0 = time.time()
    seeds = make_seeds(workdir)
    capi = build_capi(workdir) if ("capi" in kinds or args.replay) else ""
    pool = Pool(capi, args.timeout, env)
    results: List[Dict[str, Any]] = []
    if args.replay:
        cases = []
        for name in sorted(os.listdir(args.replay)):
            if name.endswith(".json"):
                with open(os.path.join(args.replay, name)) as f:
                    note = json.load(f)
                case = dict(note["case"], text=seeds["text"], joint_text=seeds["joint_text"])
                case["path"] = os.path.join(args.replay, os.path.basename(case["path"]))
                if case["kind"] == "pcache":
                    case["model"] = seeds["pcache_model"]
                cases.append(case)
        todo = iter(cases)
    else:
        todo = None
    print(f"fuzz: workdir {workdir}, seed {args.seed}, kinds {','.join(kinds)}", file=sys.stderr, flush=True)
    case_id = 0
    last_report = time.time()
    try:
        while True:
            if todo is not None:
                case = next(todo, None)
                if case is None:
                    break
            else:
                if (budget and time.time() - t0 >= budget) or (args.cases and case_id >= args.cases):
                    break
                case = make_case(seeds, case_id, args.seed, kinds, casedir, args.special_files)
                case_id += 1
            res = pool.run(case)
            res.update(kind=case["kind"], id=case["id"], mutation=case.get("mutation"), source=case.get("source"))
            results.append(res)
            if res["outcome"] in FAILURES:
                os.makedirs(faildir, exist_ok=True)
                base = os.path.basename(case["path"])
                if todo is None:
                    shutil.copy(case["path"], os.path.join(faildir, base))
                with open(os.path.join(faildir, base + ".json"), "w") as f:
                    json.dump({"case": {k: case[k] for k in ("id", "kind", "seed", "path", "source", "mutation",
                                                             "sentence") if k in case},
                               "outcome": res["outcome"], "detail": res.get("detail")}, f, indent=1)
                print(f"fuzz: case {case['id']} ({case['kind']}, {case.get('mutation')}): {res['outcome']}: "
                      f"{str(res.get('detail'))[:300]}", file=sys.stderr, flush=True)
            if not args.keep and todo is None:
                for p in (case["path"], case["path"] + ".nlm", case["path"] + ".out.gz"):
                    if os.path.exists(p):
                        os.unlink(p)
                shutil.rmtree(case["path"] + ".dir", ignore_errors=True)
            if time.time() - last_report > 60:
                last_report = time.time()
                print(f"fuzz: {len(results)} cases in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        pool.kill()
    print(f"fuzz: {len(results)} cases in {time.time() - t0:.0f} s (seed {args.seed})")
    print(summarise(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    failed = [r for r in results if r["outcome"] in FAILURES]
    if failed:
        print(f"fuzz: {len(failed)} failing cases kept in {faildir}")
    if not args.workdir:
        for sub in ("cases",):
            shutil.rmtree(os.path.join(workdir, sub), ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
