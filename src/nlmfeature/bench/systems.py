"""``nlmfeature bench system tatoeba``: build a realistic-size Moses system from fetched mirrors.

One command rebuilds the German-English phrase-based system of the larger benchmark, in the
layout of the shared Multi30k system (``bench mt --system DIR --data DIR/data`` runs on it):

1. ``data``: Tatoeba German-English (``deu-eng.zip`` of github:rioyshky/translation), every
   pair whose German or English side is in the held-out list dropped (the key of a sentence
   is the SHA-256 of its UTF-8 bytes with white space collapsed; the list's README), exact
   duplicate pairs removed (the first kept), then a seeded split: ``--dev-size`` dev and
   ``--test-size`` test pairs, the rest training.  The raw sets go to ``OUT/data``
   (``train.{de,en}.gz``, ``dev.*``, ``test.*``), with the out-of-domain tests
   newstest2013 and newstest2014 (github:Helsinki-NLP/OPUS-MT-testsets) and ``counts.json``;
2. ``prepare``: the Moses Perl pipeline (``normalize-punctuation.perl``, ``tokenizer.perl -a``,
   ``lowercase.perl``, as ``nlmfeature prepare``), then ``clean-corpus-n.perl``'s rule on the
   training pairs (1-80 words a side, length ratio at most 9): ``OUT/train.tok.lc.{de,en}.gz``;
   the dev and test sets the same way (``OUT/sets/NAME.tok.lc.LANG``);
3. ``align``: fast_align (github:clab/fast_align, built from the mirror with cmake unless
   ``--fast-align`` names a build) ``-d -o -v`` in both directions, ``atools -c
   grow-diag-final-and``: ``OUT/train.align.grow-diag-final-and.gz``;
4. ``lm``: KenLM ``lmplz -o 5`` on the English training side: ``OUT/lm.en.5g.arpa.gz``;
5. ``train``: ``train-model.perl -first-step 4 -last-step 9 -reordering msd-bidirectional-fe``
   (``--moses-root``): ``OUT/phrase-table.gz``, ``OUT/reordering-table.wbe-msd-bidirectional-fe.gz``
   and ``OUT/moses.untuned.ini`` (paths as ``MODEL_DIR/``, Moses' default weights);
6. ``tune``: the tables filtered to the dev and test sources, ``nlmfeature-tune moses`` (MERT,
   ``--seed``) on dev from the untuned weights: ``OUT/moses.tuned.ini``; every set decoded with
   the tuned weights and scored (BLEU of the tokenised lowercased output against the
   tokenised lowercased reference, sacrebleu ``-tok none``): ``OUT/results.json``;
7. ``nbest``: the tuned system's k-best lists in ``OUT/nbest``, the layout of ``nlmfeature bench
   memory --nbest-dir`` (the dev 100-best of the last MERT iteration, the test 100-best of the
   tuned system, sources, references, ``moses.tuned.ini``): memory and perplexity against BLEU
   with each model as the only LM of this system's lists.

With ``--big-lm-text FILE`` (repeatable: tokenised lowercased English, e.g. a book corpus made
by ``nlmfeature corpus gutenberg``) two more steps make a second system folder ``OUT/big``
that shares the tables and differs only in its LM:

8. ``big-lm``: ``lmplz -o 5`` on those files plus the English training side
   (``OUT/big/lm.en.5g.arpa``; ``--big-lm-memory`` bounds lmplz's memory) and its KenLM
   binary ``lm.en.5g.bin``, which ``OUT/big/moses.untuned.ini`` loads (binarising an LM
   of this size for every work folder would take minutes each time); and a third system
   folder ``OUT/big-small``, the same tables with both LMs as two features, as Moses systems
   are usually built (LM0 the big LM, LM1 the 5-gram of step 4);
9. ``big-tune``: step 6 on ``OUT/big`` (``--big-start small-tuned``: MERT starts from the small
   system's tuned weights, which takes fewer iterations).

Every step is skipped when its outputs exist (outputs are written whole or not at all), so a
rerun continues where a stopped one ended; ``--steps`` runs a subset.  Each step's seconds go to
``OUT/build.json``.  A missing input, mirror or program is an error that names it and the
option that supplies it.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from nlmfeature.bench import REPO
from nlmfeature.errors import InputError, NLMFeatureError

Pair = Tuple[str, str]

#: where the parallel text, the out-of-domain test sets and the aligner come from (GitHub
#: owner/name, path in the repository)
TATOEBA = ("rioyshky/translation", "deu-eng.zip")
TESTSETS = "Helsinki-NLP/OPUS-MT-testsets"
NEWSTEST = ("newstest2013", "newstest2014")
FAST_ALIGN = "clab/fast_align"
SRC, TGT = "de", "en"
#: the steps in order; the last two only with --big-lm-text
STEPS = ("data", "prepare", "align", "lm", "train", "tune", "nbest", "big-lm", "big-tune")
DEFAULT_MIRRORS = os.path.join("..", ".mirror")
#: clean-corpus-n.perl's limits as the Moses recipe uses them (1 80; its default ratio 9)
CLEAN_MIN, CLEAN_MAX, CLEAN_RATIO, CLEAN_MAX_WORD = 1, 80, 9.0, 1000
LM_NAME = "lm.en.5g.arpa.gz"
PHRASE_TABLE = "phrase-table.gz"
REORDERING_TABLE = "reordering-table.wbe-msd-bidirectional-fe.gz"
ALIGNMENT = "train.align.grow-diag-final-and.gz"
BIG_LM_ARPA, BIG_LM_BIN = "lm.en.5g.arpa", "lm.en.5g.bin"
#: the folder (in OUT) of the system with both LMs, the big one and the in-domain one
BOTH_DIR = "big-small"


def _log(msg: str) -> None:
    print(f"[bench system {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def default_mirrors() -> str:
    """``$NLMFEATURE_MIRRORS`` if set, else ``.mirror`` beside the source checkout (where the
    ``fetch`` of a GitHub repository puts ``OWNER+NAME/repo``)."""
    return os.environ.get("NLMFEATURE_MIRRORS") or os.path.normpath(os.path.join(REPO, DEFAULT_MIRRORS))


# -- mirrors -------------------------------------------------------------------------------------
def mirror_dir(mirrors: str, repo: str) -> str:
    """The folder of GitHub repository ``repo`` (``owner/name``) under ``mirrors``:
    ``MIRRORS/owner+name/repo`` (a bare git dir or a checkout), else ``MIRRORS/owner+name``.
    Raises :class:`InputError` naming what is missing."""
    base = os.path.join(mirrors, repo.replace("/", "+"))
    for cand in (os.path.join(base, "repo"), base):
        if os.path.isdir(cand):
            return cand
    raise InputError(base, 0, f"no mirror of github:{repo} here (--mirrors: a folder holding "
                              f"{repo.replace('/', '+')}/repo, a git dir or checkout)")


def _is_git_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "HEAD")) and os.path.isdir(os.path.join(path, "objects"))


def mirror_file(mirrors: str, repo: str, path: str) -> bytes:
    """The bytes of ``path`` in the mirror of ``repo`` (a checkout's file, else the bare git
    dir's ``HEAD:path``).  Raises :class:`InputError` when it has no such file."""
    d = mirror_dir(mirrors, repo)
    plain = os.path.join(d, path)
    if os.path.isfile(plain):
        with open(plain, "rb") as f:
            return f.read()
    git_dir = d if _is_git_dir(d) else os.path.join(d, ".git")
    if os.path.isdir(git_dir):
        res = subprocess.run(["git", "--git-dir", git_dir, "show", f"HEAD:{path}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if res.returncode == 0:
            return res.stdout
    raise InputError(os.path.join(d, path), 0, f"the mirror of github:{repo} has no such file")


def mirror_commit(mirrors: str, repo: str) -> Optional[str]:
    """The commit of the mirror's HEAD (None when it is not a git repository)."""
    d = mirror_dir(mirrors, repo)
    git_dir = d if _is_git_dir(d) else os.path.join(d, ".git")
    res = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", "HEAD"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return res.stdout.decode().strip() if res.returncode == 0 else None


# -- 1. data -------------------------------------------------------------------------------------
def read_tatoeba(data: bytes, name: str = "deu-eng.zip", limit: int = 0) -> List[Pair]:
    """(German, English) pairs of a Tatoeba export zip (``deu.txt``: ``English<TAB>German``
    lines, newer exports add an attribution column); ``limit``: the first pairs only."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        txt = [n for n in z.namelist() if n.endswith(".txt") and not os.path.basename(n).startswith("_")]
        if len(txt) != 1:
            raise InputError(name, 0, f"expected one sentence file in the zip, found {txt}")
        text = z.read(txt[0]).decode("utf-8")
    pairs = []
    for i, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if not line:
            continue
        cols = line.split("\t")
        if len(cols) < 2:
            raise InputError(f"{name}:{txt[0]}", i, "expected English<TAB>German")
        pairs.append((cols[1], cols[0]))
        if limit and len(pairs) >= limit:
            break
    return pairs


def sentence_key(sentence: str) -> str:
    """The held-out list's key of a sentence: SHA-256 (hex) of its UTF-8 bytes with white
    space collapsed, before any tokenising or lowercasing."""
    return hashlib.sha256(" ".join(sentence.split()).encode("utf-8")).hexdigest()


def read_heldout(path: str) -> set:
    """The keys of a held-out list (one SHA-256 hex a line)."""
    if not os.path.isfile(path):
        raise InputError(path, 0, "no held-out list here (--heldout)")
    keys = set(open(path, encoding="ascii").read().split())
    bad = [k for k in keys if len(k) != 64]
    if bad:
        raise InputError(path, 0, f"not a SHA-256 hex key: {bad[0]!r}")
    return keys


def drop_heldout(pairs: Sequence[Pair], keys: set) -> List[Pair]:
    """The pairs neither of whose sides' key is in ``keys``."""
    return [p for p in pairs if sentence_key(p[0]) not in keys and sentence_key(p[1]) not in keys]


def dedupe(pairs: Sequence[Pair]) -> List[Pair]:
    """``pairs`` without exact repeats of a pair (the first occurrence kept, order kept)."""
    seen, out = set(), []
    for p in pairs:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def split(pairs: Sequence[Pair], dev: int, test: int, seed: int) -> Dict[str, List[Pair]]:
    """A seeded split: ``dev`` and ``test`` pairs drawn at random (``random.Random(seed)``
    shuffles the indices: the first ``dev`` are dev, the next ``test`` test), the rest training;
    each set keeps the input order."""
    if dev < 0 or test < 0 or dev + test >= len(pairs):
        raise NLMFeatureError(f"cannot split {len(pairs)} pairs into dev {dev} and test {test} "
                              "and a training set")
    idx = list(range(len(pairs)))
    random.Random(seed).shuffle(idx)
    parts = {"dev": sorted(idx[:dev]), "test": sorted(idx[dev:dev + test]),
             "train": sorted(idx[dev + test:])}
    return {k: [pairs[i] for i in v] for k, v in parts.items()}


def _write_lines(path: str, lines: Iterable[str]) -> None:
    from nlmfeature.io.atomicfile import open_output

    with open_output(path) as f:
        for line in lines:
            f.write(line + "\n")


def _write_json(path: str, doc: dict) -> None:
    from nlmfeature.io.atomicfile import atomic_write_text

    atomic_write_text(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _one_line(s: str) -> str:
    return " ".join(s.split())


def step_data(args: argparse.Namespace, out: str) -> dict:
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    raw = read_tatoeba(mirror_file(args.mirrors, *TATOEBA), TATOEBA[1], args.limit)
    keys = read_heldout(args.heldout)
    kept = drop_heldout(raw, keys)
    unique = dedupe(kept)
    sets = split(unique, args.dev_size, args.test_size, args.seed)
    for name, pairs in sets.items():
        ext = ".gz" if name == "train" else ""
        for i, lang in enumerate((SRC, TGT)):
            _write_lines(os.path.join(data, f"{name}.{lang}{ext}"), (_one_line(p[i]) for p in pairs))
    news = {}
    if not args.no_newstest:
        for name in NEWSTEST:
            for lang in (SRC, TGT):
                text = mirror_file(args.mirrors, TESTSETS, f"testsets/de-en/{name}.{lang}").decode("utf-8")
                lines = text.rstrip("\n").split("\n")
                _write_lines(os.path.join(data, f"{name}.{lang}"), lines)
                news[name] = len(lines)
    train_src = {p[0] for p in sets["train"]}
    train_tgt = {p[1] for p in sets["train"]}
    doc = dict(source=f"github:{TATOEBA[0]} {TATOEBA[1]}", commit=mirror_commit(args.mirrors, TATOEBA[0]),
               pairs=len(raw), after_heldout=len(kept), after_dedupe=len(unique), seed=args.seed,
               limit=args.limit or None,
               sets={k: len(v) for k, v in sets.items()}, newstest=news,
               # Tatoeba translates one sentence several ways: how many dev/test sides occur
               # verbatim in training (the pairs themselves are disjoint)
               seen_in_train={k: dict(source=sum(p[0] in train_src for p in sets[k]),
                                      target=sum(p[1] in train_tgt for p in sets[k]))
                              for k in ("dev", "test")})
    _write_json(os.path.join(data, "counts.json"), doc)
    _log(f"{len(raw):,} pairs, {len(kept):,} after the held-out list, {len(unique):,} after "
         f"removing duplicates: train {len(sets['train']):,}, dev {len(sets['dev']):,}, "
         f"test {len(sets['test']):,}")
    return doc


# -- 2. prepare ----------------------------------------------------------------------------------
def clean_pair(src: str, tgt: str, min_len: int = CLEAN_MIN, max_len: int = CLEAN_MAX,
               ratio: float = CLEAN_RATIO, max_word: int = CLEAN_MAX_WORD) -> Optional[Pair]:
    """``clean-corpus-n.perl``'s rule on one tokenised pair: ``|`` removed, white space
    collapsed; None when a side is empty, has fewer than ``min_len`` or more than ``max_len``
    words, the length ratio exceeds ``ratio`` or a word is longer than ``max_word``."""
    s = " ".join(src.replace("|", "").split())
    t = " ".join(tgt.replace("|", "").split())
    if not s or not t:
        return None
    ns, nt = len(s.split(" ")), len(t.split(" "))
    if not (min_len <= ns <= max_len and min_len <= nt <= max_len):
        return None
    if ns / nt > ratio or nt / ns > ratio:
        return None
    if any(len(w) > max_word for w in s.split(" ") + t.split(" ")):
        return None
    return s, t


def eval_sets(out: str) -> List[str]:
    """The names of the dev and test sets in ``OUT/data`` (dev first)."""
    data = os.path.join(out, "data")
    names = ["dev", "test"] + [n for n in NEWSTEST if os.path.exists(os.path.join(data, f"{n}.{SRC}"))]
    return names


def step_prepare(args: argparse.Namespace, out: str) -> dict:
    from nlmfeature.io.textio import read_lines
    from nlmfeature.mt.prepare import Preparer

    data = os.path.join(out, "data")
    prep = {l: Preparer(l) for l in (SRC, TGT)}
    sets_dir = os.path.join(out, "sets")
    os.makedirs(sets_dir, exist_ok=True)
    for name in eval_sets(out):
        for lang in (SRC, TGT):
            dst = os.path.join(sets_dir, f"{name}.tok.lc.{lang}")
            if not os.path.exists(dst):
                _write_lines(dst, prep[lang].lines(read_lines(os.path.join(data, f"{name}.{lang}"))))
    src = read_lines(os.path.join(data, f"train.{SRC}.gz"))
    tgt = read_lines(os.path.join(data, f"train.{TGT}.gz"))
    if len(src) != len(tgt):
        raise InputError(os.path.join(data, f"train.{TGT}.gz"), 0, "not as many lines as the source")
    t0 = time.time()
    tok_s = list(prep[SRC].lines(src))
    tok_t = list(prep[TGT].lines(tgt))
    pairs = [c for c in (clean_pair(s, t) for s, t in zip(tok_s, tok_t)) if c]
    _write_lines(os.path.join(out, f"train.tok.lc.{SRC}.gz"), (p[0] for p in pairs))
    _write_lines(os.path.join(out, f"train.tok.lc.{TGT}.gz"), (p[1] for p in pairs))
    words = (sum(len(p[0].split()) for p in pairs), sum(len(p[1].split()) for p in pairs))
    _log(f"prepared {len(src):,} training pairs in {time.time() - t0:.0f} s, {len(pairs):,} kept "
         f"by the length rule ({words[0]:,} / {words[1]:,} words)")
    return dict(pairs=len(src), kept=len(pairs), words={SRC: words[0], TGT: words[1]})


# -- 3. align ------------------------------------------------------------------------------------
def _run(cmd: List[str], log_path: str, stdout=None, stdin=None, cwd=None) -> None:
    """Run ``cmd`` (stderr to ``log_path``); raise naming the command and the log's tail."""
    _log("$ " + " ".join(shlex.quote(c) for c in cmd))
    with open(log_path, "ab") as log:
        res = subprocess.run(cmd, stdout=stdout if stdout is not None else log, stderr=log,
                             stdin=stdin, cwd=cwd)
    if res.returncode:
        tail = open(log_path, "rb").read()[-3000:].decode("utf-8", "replace")
        raise NLMFeatureError(f"{os.path.basename(cmd[0])} failed (status {res.returncode}; "
                              f"log {log_path}):\n{tail}")


def find_fast_align(args: argparse.Namespace, out: str) -> Tuple[str, str]:
    """``fast_align`` and ``atools``: in ``--fast-align`` (a folder holding both, or a build
    folder with them under ``build/``), else built once from the mirror into ``OUT/tools``."""
    def look(d: str) -> Optional[Tuple[str, str]]:
        for cand in (d, os.path.join(d, "build")):
            fa, at = os.path.join(cand, "fast_align"), os.path.join(cand, "atools")
            if os.access(fa, os.X_OK) and os.access(at, os.X_OK):
                return fa, at
        return None

    if args.fast_align:
        found = look(args.fast_align)
        if not found:
            raise InputError(args.fast_align, 0, "no fast_align and atools executables here "
                                                 "(--fast-align)")
        return found
    src = os.path.join(out, "tools", "fast_align")
    found = look(src)
    if found:
        return found
    if shutil.which("cmake") is None:
        raise NLMFeatureError("building fast_align needs cmake on PATH (or give --fast-align)")
    d = mirror_dir(args.mirrors, FAST_ALIGN)
    tmp = src + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    git_dir = d if _is_git_dir(d) else os.path.join(d, ".git")
    if os.path.isdir(git_dir):
        archive = subprocess.run(["git", "--git-dir", git_dir, "archive", "HEAD"],
                                 stdout=subprocess.PIPE, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
    else:
        shutil.copytree(d, tmp, dirs_exist_ok=True)
    build = os.path.join(tmp, "build")
    os.makedirs(build)
    log = os.path.join(out, "tools", "fast_align.log")
    # an old CMakeLists: cmake 4 needs the policy floor
    _run(["cmake", "-S", tmp, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
          "-DCMAKE_POLICY_VERSION_MINIMUM=3.5"], log)
    _run(["cmake", "--build", build, "-j", str(max(1, args.threads))], log)
    os.replace(tmp, src)
    found = look(src)
    if not found:
        raise NLMFeatureError(f"fast_align built but its executables are missing (log {log})")
    return found


def step_align(args: argparse.Namespace, out: str) -> dict:
    from nlmfeature.io.textio import read_lines

    fa, atools = find_fast_align(args, out)
    work = os.path.join(out, "work", "align")
    os.makedirs(work, exist_ok=True)
    src = read_lines(os.path.join(out, f"train.tok.lc.{SRC}.gz"))
    tgt = read_lines(os.path.join(out, f"train.tok.lc.{TGT}.gz"))
    bitext = os.path.join(work, "train.de-en")
    _write_lines(bitext, (f"{s} ||| {t}" for s, t in zip(src, tgt)))
    log = os.path.join(work, "align.log")
    for name, extra in (("forward", []), ("reverse", ["-r"])):
        dst = os.path.join(work, name)
        if not os.path.exists(dst):
            with open(dst + ".tmp", "wb") as f:
                _run([fa, "-i", bitext, "-d", "-o", "-v"] + extra, log, stdout=f)
            os.replace(dst + ".tmp", dst)
    sym = os.path.join(work, "grow-diag-final-and")
    with open(sym + ".tmp", "wb") as f:
        _run([atools, "-i", os.path.join(work, "forward"), "-j", os.path.join(work, "reverse"),
              "-c", "grow-diag-final-and"], log, stdout=f)
    lines = open(sym + ".tmp", encoding="utf-8").read().split("\n")[:-1]
    if len(lines) != len(src):
        raise NLMFeatureError(f"atools wrote {len(lines)} alignments for {len(src)} pairs (log {log})")
    _write_lines(os.path.join(out, ALIGNMENT), lines)
    os.remove(sym + ".tmp")
    return dict(pairs=len(lines), links=sum(len(l.split()) for l in lines))


# -- 4. lm ---------------------------------------------------------------------------------------
def kenlm_dirs(args: argparse.Namespace) -> List[Optional[str]]:
    return [os.path.join(args.moses_root, "bin") if args.moses_root else None]


def build_lm(args: argparse.Namespace, texts: Sequence[str], dst: str, memory: str) -> dict:
    """``lmplz -o 5`` on the concatenated ``texts`` (plain or .gz): the ARPA file ``dst``
    (gzipped when it ends with ``.gz``)."""
    from nlmfeature.io.textio import open_binary
    from nlmfeature.training.kenlm_baseline import find_tool

    lmplz = find_tool("lmplz", kenlm_dirs(args))
    for t in texts:
        if not os.path.isfile(t):
            raise InputError(t, 0, "no such LM training text")
    tmpdir = os.path.dirname(dst)
    log = dst + ".log"
    cmd = [lmplz, "-o", "5", "-S", memory, "-T", tmpdir]
    compress = dst.endswith(".gz")
    _log("$ cat " + " ".join(shlex.quote(t) for t in texts) + " | " + " ".join(cmd)
         + (" | gzip" if compress else "") + " > " + dst)
    tmp = dst + ".tmp"
    with open(tmp, "wb") as raw, open(log, "wb") as err:
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) \
            if compress else raw
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        import threading

        def feed() -> None:
            try:
                for t in texts:
                    with open_binary(t) as f:
                        shutil.copyfileobj(f, proc.stdin, 1 << 20)
            except BrokenPipeError:
                pass
            finally:
                proc.stdin.close()

        th = threading.Thread(target=feed, daemon=True)
        th.start()
        shutil.copyfileobj(proc.stdout, gz, 1 << 20)
        th.join()
        rc = proc.wait()
        if compress:
            gz.close()
    if rc:
        tail = open(log, "rb").read()[-3000:].decode("utf-8", "replace")
        raise NLMFeatureError(f"lmplz failed (status {rc}; log {log}):\n{tail}")
    os.replace(tmp, dst)
    return dict(ngrams=arpa_counts(dst))


def arpa_counts(path: str) -> List[int]:
    """The n-gram counts of an ARPA file's header."""
    counts = []
    with (gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz")
          else open(path, encoding="utf-8")) as f:
        for line in f:
            if line.startswith("ngram "):
                counts.append(int(line.split("=")[1]))
            elif line.startswith("\\1-grams:"):
                break
    return counts


def step_lm(args: argparse.Namespace, out: str) -> dict:
    return build_lm(args, [os.path.join(out, f"train.tok.lc.{TGT}.gz")], os.path.join(out, LM_NAME),
                    args.lm_memory)


# -- 5. train ------------------------------------------------------------------------------------
def find_moses_root(args: argparse.Namespace) -> str:
    root = args.moses_root
    if not root:
        raise NLMFeatureError("give the Moses tree with --moses-root or MOSES_ROOT (its "
                              "scripts/training/train-model.perl and bin/extract, bin/score ...)")
    script = os.path.join(root, "scripts", "training", "train-model.perl")
    if not os.path.isfile(script):
        raise InputError(script, 0, "no train-model.perl in this Moses tree (--moses-root)")
    for prog in ("extract", "score", "consolidate", "lexical-reordering-score"):
        if not os.access(os.path.join(root, "bin", prog), os.X_OK):
            raise InputError(os.path.join(root, "bin", prog), 0,
                             "Moses' training program is missing: build Moses first (--moses-root)")
    return root


def untuned_ini(lines: Sequence[str], out: str) -> List[str]:
    """The lines of train-model.perl's moses.ini with every ``path=`` made ``MODEL_DIR/NAME``
    (the files are moved into ``out``)."""
    import re

    res = []
    for line in lines:
        m = re.search(r"\bpath=(\S+)", line)
        if m and not line.lstrip().startswith("#"):
            name = os.path.basename(m.group(1))
            if not os.path.exists(os.path.join(out, name)):
                raise NLMFeatureError(f"moses.ini names {m.group(1)}, not in {out}")
            line = line.replace(m.group(0), "path=MODEL_DIR/" + name)
        res.append(line)
    return res


def step_train(args: argparse.Namespace, out: str) -> dict:
    from nlmfeature.io.textio import read_lines

    root = find_moses_root(args)
    work = os.path.abspath(os.path.join(out, "work", "train"))
    corpus = os.path.join(work, "corpus")
    model = os.path.join(work, "model")
    os.makedirs(corpus, exist_ok=True)
    os.makedirs(model, exist_ok=True)
    for lang in (SRC, TGT):
        _write_lines(os.path.join(corpus, f"train.{lang}"),
                     read_lines(os.path.join(out, f"train.tok.lc.{lang}.gz")))
    _write_lines(os.path.join(model, "aligned.grow-diag-final-and"),
                 read_lines(os.path.join(out, ALIGNMENT)))
    lm = os.path.abspath(os.path.join(out, LM_NAME))
    if not os.path.isfile(lm):
        raise InputError(lm, 0, "the LM is made by the step 'lm' first")
    cmd = ["perl", os.path.join(root, "scripts", "training", "train-model.perl"),
           "-root-dir", work, "-corpus", os.path.join(corpus, "train"), "-f", SRC, "-e", TGT,
           "-alignment", "grow-diag-final-and", "-reordering", "msd-bidirectional-fe",
           "-lm", f"0:5:{lm}:8", "-first-step", "4", "-last-step", "9",
           "-cores", str(max(1, args.threads))]
    _run(cmd, os.path.join(work, "train-model.log"), cwd=work)
    for name in (PHRASE_TABLE, REORDERING_TABLE):
        src = os.path.join(model, name)
        if not os.path.isfile(src):
            raise NLMFeatureError(f"train-model.perl did not write {src} (log {work}/train-model.log)")
        shutil.copyfile(src, os.path.join(out, name + ".tmp"))
        os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    lines = untuned_ini(read_lines(os.path.join(model, "moses.ini")), out)
    _write_lines(os.path.join(out, "moses.untuned.ini"), lines)
    entries = sum(1 for _ in gzip.open(os.path.join(out, PHRASE_TABLE), "rb"))
    _log(f"phrase table: {entries:,} entries")
    return dict(phrase_table_entries=entries)


# -- 6. tune -------------------------------------------------------------------------------------
def bleu(hyp: str, ref: str) -> float:
    """Corpus BLEU of tokenised lowercased output against a tokenised lowercased reference
    (sacrebleu ``-tok none``)."""
    from nlmfeature.mt.bleu import References, corpus_bleu
    from nlmfeature.io.textio import read_lines

    refs = References.from_files([ref], tokenize="none")
    return float(corpus_bleu(refs.corpus_stats(read_lines(hyp)).sum(axis=0)))


def requested_sets(args: argparse.Namespace, out: str) -> List[str]:
    """The sets decoded with the tuned weights: dev, then ``--eval-sets`` (default every set)."""
    if args.eval_sets:
        return ["dev"] + [n for n in args.eval_sets if n != "dev"]
    return eval_sets(out)


def _results_cover(path: str, names: Sequence[str]) -> bool:
    try:
        return set(names) <= set(json.load(open(path))["bleu"])
    except (OSError, ValueError, KeyError):
        return False


def tune_system(args: argparse.Namespace, system: str, out: str, start: Optional[str] = None) -> dict:
    """MERT-tune ``system``'s ``moses.untuned.ini`` on dev (tables filtered to every set's
    source, the LM binarised), from its weights or those of the config ``start``; write
    ``system/moses.tuned.ini`` and decode every set."""
    from nlmfeature.commands.tune import main as tune_main
    from nlmfeature.mt import moses as m
    from nlmfeature.mt.tuning.driver import DriverState

    exe = m.find_moses(args.moses, args.moses_root, features=())
    sets_dir = os.path.join(out, "sets")
    every = eval_sets(out)
    names = requested_sets(args, out)
    srcs = {n: os.path.join(sets_dir, f"{n}.tok.lc.{SRC}") for n in every}
    refs = {n: os.path.join(sets_dir, f"{n}.tok.lc.{TGT}") for n in every}
    for n in names:
        for p in (srcs.get(n, n), refs.get(n, n)):
            if not os.path.isfile(p):
                raise InputError(p, 0, "no such prepared set (the step 'prepare' writes them; "
                                       "--eval-sets names sets of OUT/data)")
    work = os.path.join(system, "work", "tune")
    untuned = os.path.join(system, "moses.untuned.ini")
    if start:
        from nlmfeature.mt.weights import read_weights

        first = os.path.join(work, "start.moses.ini")
        os.makedirs(work, exist_ok=True)
        m.rewrite_moses_ini(untuned, first, read_weights(start))
        untuned = first
    # the tables are filtered to every set, so that decoding another set later reuses them
    prepared = m.prepare_system(untuned, os.path.join(work, "system"),
                                [srcs[n] for n in every], system, kenlm_bin=kenlm_dirs(args), log=_log)
    tdir = os.path.join(work, f"mert.seed{args.seed}")
    argv = ["moses", "--moses", exe, "--config", prepared.ini, "--source", srcs["dev"],
            "--ref", refs["dev"], "--workdir", tdir, "--threads", str(args.threads),
            "--algorithm", "mert", "--seed", str(args.seed), "--max-iterations",
            str(args.max_iterations), "--quiet"]
    _log("$ nlmfeature tune " + " ".join(shlex.quote(a) for a in argv))
    t0 = time.time()
    status = tune_main(argv)
    if status:
        raise NLMFeatureError(f"nlmfeature tune moses failed (status {status}; work folder {tdir})")
    tune_seconds = time.time() - t0
    state = DriverState.load(os.path.join(tdir, "state.json"))
    weights = state.weights
    tuned_work = os.path.join(work, "tuned.moses.ini")
    m.rewrite_moses_ini(prepared.ini, tuned_work, weights)
    res_path = os.path.join(system, "results.json")
    earlier = json.load(open(res_path)) if os.path.exists(res_path) else {}
    res: dict = dict(iterations=[dict(iteration=h["iteration"], dev_bleu=h.get("dev_bleu"))
                                 for h in sorted(state.history, key=lambda h: h["iteration"])],
                     stop_reason=state.stop_reason,
                     tune_seconds=max(round(tune_seconds), earlier.get("tune_seconds", 0)),
                     weights=weights, bleu=earlier.get("bleu", {}),
                     decode_seconds=earlier.get("decode_seconds", {}))
    tuned = [l for l in m.moses_ini_lines(os.path.join(system, "moses.untuned.ini"), weights)
             if not l.startswith(("# The default weights are NOT", "# Documentation for tuning"))]
    tuned = [l if l.strip() != "[weight]" else
             f"[weight]\n# MERT-tuned on dev (seed {args.seed}) by nlmfeature bench system; "
             "BLEU in results.json" for l in tuned]
    _write_lines(os.path.join(system, "moses.tuned.ini"), tuned)
    for n in names:
        hyp = os.path.join(work, f"{n}.tuned.out")
        secs = m.decode(exe, tuned_work, srcs[n], hyp, threads=args.threads)
        res["bleu"][n] = round(bleu(hyp, refs[n]), 2)
        res["decode_seconds"][n] = round(secs, 1)
        _log(f"{os.path.basename(system)} {n}: BLEU {res['bleu'][n]:.2f} ({secs:.0f} s)")
        _write_json(res_path, res)
    return dict(bleu=res["bleu"], iterations=len(res["iterations"]), tune_seconds=res["tune_seconds"])


def step_tune(args: argparse.Namespace, out: str) -> dict:
    return tune_system(args, out, out)


# -- 7. k-best lists ------------------------------------------------------------------------------
#: the k-best lists of the tuned system, for ``nlmfeature bench memory --nbest-dir OUT/nbest``
NBEST_DIR = "nbest"
NBEST_SIZE = 100


def step_nbest(args: argparse.Namespace, out: str) -> dict:
    """The tuned system's k-best lists in the layout of ``bench memory --nbest-dir``: the dev
    100-best of the last MERT iteration (``dev.iterN.100best.gz``) and the test 100-best of
    the tuned system (``test.tuned.100best.gz``), with the tokenised lowercased sources and
    references (``{dev,test}.{src.de,ref.en}.gz``) and ``moses.tuned.ini``."""
    import glob
    import gzip
    import shutil

    from nlmfeature.mt import moses as m
    from nlmfeature.mt.tuning.driver import DriverState

    tdir = os.path.join(out, "work", "tune", f"mert.seed{args.seed}")
    tuned_work = os.path.join(out, "work", "tune", "tuned.moses.ini")
    state_path = os.path.join(tdir, "state.json")
    for p in (state_path, tuned_work):
        if not os.path.isfile(p):
            raise InputError(p, 0, "the step 'nbest' writes the tuned system's lists: run the step 'tune' first")
    last = max(h["iteration"] for h in DriverState.load(state_path).history)
    dev_kbest = os.path.join(tdir, f"run{last}.kbest.gz")
    if not os.path.isfile(dev_kbest):
        raise InputError(dev_kbest, 0, "the last MERT iteration's k-best list is missing")
    nb = os.path.join(out, NBEST_DIR)
    os.makedirs(nb, exist_ok=True)
    for old in glob.glob(os.path.join(nb, "dev.iter*.100best.gz")):
        os.unlink(old)          # one dev list: the last iteration's
    shutil.copyfile(dev_kbest, os.path.join(nb, f"dev.iter{last}.{NBEST_SIZE}best.gz"))
    sets_dir = os.path.join(out, "sets")
    for name in ("dev", "test"):
        for lang, kind in ((SRC, "src"), (TGT, "ref")):
            with open(os.path.join(sets_dir, f"{name}.tok.lc.{lang}"), "rb") as f, \
                    gzip.open(os.path.join(nb, f"{name}.{kind}.{lang}.gz"), "wb") as g:
                shutil.copyfileobj(f, g)
    exe = m.find_moses(args.moses, args.moses_root, features=())
    hyp = os.path.join(out, "work", "tune", "test.tuned.nbest.out")
    kbest = os.path.join(out, "work", "tune", f"test.tuned.{NBEST_SIZE}best")
    secs = m.decode(exe, tuned_work, os.path.join(sets_dir, f"test.tok.lc.{SRC}"), hyp,
                    threads=args.threads, kbest=NBEST_SIZE, kbest_out=kbest, distinct=True)
    with open(kbest, "rb") as f, gzip.open(os.path.join(nb, f"test.tuned.{NBEST_SIZE}best.gz"), "wb") as g:
        shutil.copyfileobj(f, g)
    shutil.copyfile(os.path.join(out, "moses.tuned.ini"), os.path.join(nb, "moses.tuned.ini"))
    _log(f"nbest: dev list of MERT iteration {last}, test {NBEST_SIZE}-best decoded in {secs:.0f} s")
    return dict(dev_iteration=last, test_decode_seconds=round(secs, 1), folder=nb)


# -- 8-9. the big LM -----------------------------------------------------------------------------
def big_dir(out: str) -> str:
    return os.path.join(out, "big")


def step_big_lm(args: argparse.Namespace, out: str) -> dict:
    """The big LM (an ARPA file ``OUT/big/lm.en.5g.arpa`` and its KenLM probing binary
    ``lm.en.5g.bin``, which the decoder loads) and the system folder ``OUT/big``: the small
    system's tables and training text by relative links, its untuned config with this LM."""
    from nlmfeature.io.textio import read_lines
    from nlmfeature.mt.moses import binarise_lm

    big = big_dir(out)
    os.makedirs(big, exist_ok=True)
    untuned = os.path.join(out, "moses.untuned.ini")
    if not os.path.isfile(untuned):
        raise InputError(untuned, 0, "the big-LM system shares the step 'train''s tables: run it first")
    texts = [os.path.abspath(t) for t in args.big_lm_text] + [os.path.join(out, f"train.tok.lc.{TGT}.gz")]
    arpa = os.path.join(big, BIG_LM_ARPA)
    res: dict = {}
    if not os.path.exists(arpa):
        t0 = time.time()
        res = build_lm(args, texts, arpa, args.big_lm_memory)
        res["lmplz_seconds"] = round(time.time() - t0)
        res["texts"] = texts
    else:
        res["ngrams"] = arpa_counts(arpa)
    t0 = time.time()
    if binarise_lm(arpa, os.path.join(big, BIG_LM_BIN), *kenlm_dirs(args)):
        res["build_binary_seconds"] = round(time.time() - t0)
    res["reused"] = "lmplz_seconds" not in res and "build_binary_seconds" not in res
    res["bytes"] = {n: os.path.getsize(os.path.join(big, n)) for n in (BIG_LM_ARPA, BIG_LM_BIN)}
    small_lines = list(read_lines(untuned))
    lines = [l.replace(f"path=MODEL_DIR/{LM_NAME}", f"path=MODEL_DIR/{BIG_LM_BIN}") for l in small_lines]
    _link_tables(out, big)
    _write_lines(os.path.join(big, "moses.untuned.ini"), lines)
    both = os.path.join(out, BOTH_DIR)
    os.makedirs(both, exist_ok=True)
    _link_tables(out, both, (LM_NAME,))
    if not os.path.lexists(os.path.join(both, BIG_LM_BIN)):
        os.symlink(os.path.join("..", os.path.basename(big), BIG_LM_BIN), os.path.join(both, BIG_LM_BIN))
    _write_lines(os.path.join(both, "moses.untuned.ini"), with_second_lm(lines, small_lines))
    return res


def _link_tables(out: str, folder: str, extra: Sequence[str] = ()) -> None:
    """Relative links in ``folder`` to the tables, the alignment, the training text and
    ``extra`` of the system in ``out``."""
    for name in os.listdir(out):
        if name in (PHRASE_TABLE, REORDERING_TABLE, ALIGNMENT) + tuple(extra) or name.startswith("train.tok.lc."):
            link = os.path.join(folder, name)
            if not os.path.lexists(link):
                os.symlink(os.path.join("..", name), link)


def with_second_lm(lines: Sequence[str], small_lines: Sequence[str]) -> List[str]:
    """The moses.ini ``lines`` with the LM of ``small_lines`` (the same config on another
    LM) as a second LM feature ``LM1``, after ``LM0`` and with its weight."""
    small = next(l for l in small_lines if l.split() and l.split()[0] == "KENLM")
    res = []
    for line in lines:
        res.append(line)
        toks = line.split()
        if toks and toks[0] == "KENLM":
            res.append(small.replace("name=LM0", "name=LM1"))
        elif toks and toks[0] == "LM0=":
            res.append("LM1= " + " ".join(toks[1:]))
    return res


def step_big_tune(args: argparse.Namespace, out: str) -> dict:
    start = None
    if args.big_start == "small-tuned":
        start = os.path.join(out, "moses.tuned.ini")
        if not os.path.isfile(start):
            raise InputError(start, 0, "--big-start small-tuned needs the step 'tune' first")
    res = tune_system(args, big_dir(out), out, start)
    res["start"] = args.big_start
    return res


# -- the driver ----------------------------------------------------------------------------------
def outputs(step: str, out: str) -> List[str]:
    """The files whose existence means ``step`` is done."""
    big = big_dir(out)
    return {
        "data": [os.path.join(out, "data", "counts.json")],
        "prepare": [os.path.join(out, f"train.tok.lc.{l}.gz") for l in (SRC, TGT)],
        "align": [os.path.join(out, ALIGNMENT)],
        "lm": [os.path.join(out, LM_NAME)],
        "train": [os.path.join(out, n) for n in (PHRASE_TABLE, REORDERING_TABLE, "moses.untuned.ini")],
        "tune": [os.path.join(out, "moses.tuned.ini"), os.path.join(out, "results.json")],
        "nbest": [os.path.join(out, NBEST_DIR, n) for n in ("test.tuned.100best.gz", "moses.tuned.ini")],
        "big-lm": [os.path.join(big, BIG_LM_BIN), os.path.join(big, "moses.untuned.ini"),
                   os.path.join(out, BOTH_DIR, "moses.untuned.ini")],
        "big-tune": [os.path.join(big, "moses.tuned.ini"), os.path.join(big, "results.json")],
    }[step]


RUNNERS: Dict[str, Callable[[argparse.Namespace, str], dict]] = {
    "data": step_data, "prepare": step_prepare, "align": step_align, "lm": step_lm,
    "train": step_train, "tune": step_tune, "nbest": step_nbest, "big-lm": step_big_lm,
    "big-tune": step_big_tune}


def build(args: argparse.Namespace) -> dict:
    """Run the steps of ``args.steps`` in order, each skipped when its outputs exist; returns
    (and keeps in ``OUT/build.json``) each step's seconds and figures."""
    out = os.path.abspath(args.output)
    os.makedirs(out, exist_ok=True)
    record_path = os.path.join(out, "build.json")
    record = json.load(open(record_path)) if os.path.exists(record_path) else {}
    for step in args.steps:
        if step.startswith("big-") and not args.big_lm_text and step == "big-lm":
            raise NLMFeatureError("the step 'big-lm' needs --big-lm-text")
        done = all(os.path.exists(p) for p in outputs(step, out))
        if done and step in ("tune", "big-tune"):
            system = out if step == "tune" else big_dir(out)
            done = _results_cover(os.path.join(system, "results.json"), requested_sets(args, out))
        if done:
            _log(f"{step}: done ({', '.join(os.path.relpath(p, out) for p in outputs(step, out))})")
            continue
        _log(f"{step} ...")
        t0 = time.time()
        res = RUNNERS[step](args, out)
        if res.pop("reused", False) and step in record:
            res = {**record[step], **res}   # finished an earlier run: its figures and seconds stay
        else:
            res["seconds"] = round(time.time() - t0, 1)
        record[step] = res
        _write_json(record_path, record)
        _log(f"{step}: {res['seconds']:.0f} s")
    return record


def run(args: argparse.Namespace) -> int:
    """``nlmfeature bench system``: build the system (the steps asked), print the build record."""
    from nlmfeature.io.jsonout import dumps_json

    args.mirrors = os.path.abspath(args.mirrors or default_mirrors())
    args.moses_root = args.moses_root or os.environ.get("MOSES_ROOT") or None
    if args.eval_sets:
        args.eval_sets = [s for s in args.eval_sets.split(",") if s]
    if args.steps:
        steps = [s for s in args.steps.split(",") if s]
        bad = [s for s in steps if s not in STEPS]
        if bad:
            raise NLMFeatureError(f"unknown step(s) {bad}: the steps are {', '.join(STEPS)}")
        args.steps = [s for s in STEPS if s in steps]
    else:
        args.steps = [s for s in STEPS if not s.startswith("big-") or args.big_lm_text]
    record = build(args)
    if args.json:
        print(dumps_json(record))
    else:
        for step in args.steps:
            if step in record:
                print(f"{step:9s} {record[step].get('seconds', 0):8.0f} s  "
                      + json.dumps({k: v for k, v in record[step].items() if k != 'seconds'}))
    return 0
