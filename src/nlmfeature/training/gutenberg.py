"""A large English corpus from Project Gutenberg books: raw e-texts -> tokenised sentences.

The input is a folder of Gutenberg plain-text books (``Author/Title.txt``, CRLF, hard-wrapped
at about 70 characters, each with the Gutenberg licence header and footer), either checked out
or as a git repository without a work tree (a mirror): the books are then read from its
``HEAD`` with ``git cat-file``, so nothing is checked out.  Each book:

1. keeps only the text between the ``*** START OF ...`` and ``*** END OF ...`` markers (books
   without them are skipped: their licence text cannot be told from the book);
2. joins the hard-wrapped lines of each paragraph (paragraphs end at blank lines);
3. splits paragraphs into sentences (after ``.``, ``!`` or ``?`` and any closing quotes or
   brackets, before an upper-case letter, a digit or an opening quote; common abbreviations
   such as ``Mr.`` do not end a sentence);
4. prepares every sentence as ``nlmfeature prepare`` does (Moses' normalise, tokenise ``-a``,
   lowercase): the vocabulary rules of a Moses system's language model.

Whole books are held out: those whose SHA-1 of the path is smallest go to ``valid.txt`` and the
next ones to ``test.txt`` (``--heldout-books`` each), the rest to ``train.txt``; ``books.tsv``
records which book went where and how many sentences and tokens it gave.  The same mirror gives
the same files.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from nlmfeature.errors import NLMFeatureError

_START = re.compile(r"^\*\*\*\s*START OF (THIS|THE) PROJECT GUTENBERG", re.I | re.M)
_END = re.compile(r"^\*\*\*\s*END OF (THIS|THE) PROJECT GUTENBERG|^End of (the )?Project Gutenberg", re.I | re.M)
_ABBREV = {"mr", "mrs", "ms", "dr", "st", "mt", "jr", "sr", "messrs", "mme", "mlle", "prof", "rev",
           "capt", "col", "gen", "lt", "sgt", "gov", "hon", "vol", "ch", "chap", "no", "vs", "etc",
           "viz", "cf", "ibid", "esq", "co", "bros", "i.e", "e.g", "p", "pp", "fig"}
_BOUNDARY = re.compile(r"([.!?]+[\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]*[A-Z0-9])")
_WS = re.compile(r"\s+")


def book_body(text: str) -> Optional[str]:
    """The text between the Gutenberg start and end markers, or None if either is missing."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff")
    m = _START.search(text)
    if not m:
        return None
    start = text.find("\n", m.end())
    e = _END.search(text, start if start >= 0 else m.end())
    if not e:
        return None
    return text[start + 1 if start >= 0 else m.end():e.start()]


def paragraphs(body: str) -> Iterator[str]:
    """Paragraphs (runs of non-blank lines, joined with spaces)."""
    for block in re.split(r"\n\s*\n", body):
        p = _WS.sub(" ", block).strip()
        if p:
            yield p


def sentences(paragraph: str) -> List[str]:
    """Split a paragraph into sentences (see the module doc)."""
    out: List[str] = []
    start = 0
    for m in _BOUNDARY.finditer(paragraph):
        end = m.end(1)
        head = paragraph[start:end]
        last = head.rsplit(None, 1)[-1] if head.strip() else ""
        word = last.rstrip(".!?\"'\u201d\u2019)]").lower()
        if m.group(1).startswith(".") and (word in _ABBREV or (len(word) == 1 and word.isalpha())):
            continue
        s = head.strip()
        if s:
            out.append(s)
        start = m.end()
    tail = paragraph[start:].strip()
    if tail:
        out.append(tail)
    return out


def list_books(source: str) -> List[Tuple[str, str]]:
    """(path, git object or file path) of every ``.txt`` book under ``source`` (a folder or a
    git repository without a work tree), sorted by path."""
    if os.path.isdir(os.path.join(source, "objects")) or source.endswith(".git"):
        try:
            out = subprocess.run(["git", "--git-dir", source, "ls-tree", "-r", "-z", "HEAD"],
                                 check=True, capture_output=True).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            raise NLMFeatureError(f"{source}: cannot list the repository's files ({exc})") from None
        books = []
        for rec in out.split(b"\0"):
            if not rec:
                continue
            meta, path = rec.split(b"\t", 1)
            name = path.decode("utf-8", "replace")
            if name.endswith(".txt") and meta.split()[1] == b"blob":
                books.append((name, "git:" + meta.split()[2].decode()))
        return sorted(books)
    if not os.path.isdir(source):
        raise NLMFeatureError(f"{source}: no such folder")
    books = []
    for root, _, files in os.walk(source):
        for f in files:
            if f.endswith(".txt"):
                full = os.path.join(root, f)
                books.append((os.path.relpath(full, source), full))
    return sorted(books)


def _read_book(source: str, ref: str) -> Optional[str]:
    if ref.startswith("git:"):
        r = subprocess.run(["git", "--git-dir", source, "cat-file", "blob", ref[4:]], capture_output=True)
        if r.returncode != 0:   # a large file a mirror left out
            return None
        data = r.stdout
    else:
        with open(ref, "rb") as f:
            data = f.read()
    return data.decode("utf-8", "replace")


_PREPARER = None


def _prepare_book(job: Tuple[str, str, str]) -> Tuple[str, List[str]]:
    """(path, prepared sentences) of one book (a worker process)."""
    global _PREPARER
    from nlmfeature.mt.prepare import Preparer

    if _PREPARER is None:
        _PREPARER = Preparer("en")
    source, path, ref = job
    text = _read_book(source, ref)
    body = book_body(text) if text is not None else None
    if body is None:
        return path, []
    out = []
    for p in paragraphs(body):
        for s in sentences(p):
            t = _PREPARER(s)
            if t:
                out.append(t)
    return path, out


def heldout_split(paths: Iterable[str], books: int) -> Dict[str, str]:
    """Which part (``train``, ``valid``, ``test``) each book goes to: the ``books`` paths with the
    smallest SHA-1 are ``valid``, the next ``books`` are ``test``."""
    ranked = sorted(paths, key=lambda p: hashlib.sha1(p.encode("utf-8")).hexdigest())
    part = {p: "train" for p in ranked}
    for p in ranked[:books]:
        part[p] = "valid"
    for p in ranked[books:2 * books]:
        part[p] = "test"
    return part


def build(source: str, out_dir: str, heldout_books: int = 5, jobs: int = 2, limit: int = 0,
          log=None) -> Dict[str, int]:
    """Write ``train.txt``, ``valid.txt``, ``test.txt`` and ``books.tsv`` under ``out_dir``
    (atomically, each); returns the token count of each part.  ``limit`` > 0 keeps that many
    training books (the first in SHA-1 order of their paths: a sample across authors)."""
    from nlmfeature.io.atomicfile import open_output

    books = list_books(source)
    if not books:
        raise NLMFeatureError(f"{source}: no .txt books found")
    part = heldout_split([p for p, _ in books], heldout_books)
    if limit:   # the held-out books and the first training books in the same hash order
        ranked = sorted((p for p, _ in books), key=lambda p: hashlib.sha1(p.encode("utf-8")).hexdigest())
        keep = set(ranked[:2 * heldout_books + limit])
        books = [b for b in books if b[0] in keep]
    os.makedirs(out_dir, exist_ok=True)
    tokens = {"train": 0, "valid": 0, "test": 0}
    names = {k: os.path.join(out_dir, k + ".txt") for k in tokens}
    with open_output(names["train"]) as tr, open_output(names["valid"]) as va, \
            open_output(names["test"]) as te, open_output(os.path.join(out_dir, "books.tsv")) as idx:
        files = {"train": tr, "valid": va, "test": te}
        idx.write("part\tsentences\ttokens\tbook\n")
        jobs_list = [(source, p, ref) for p, ref in books]
        with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
            for n, (path, sents) in enumerate(pool.map(_prepare_book, jobs_list, chunksize=4)):
                k = part[path]
                ntok = sum(len(s.split()) for s in sents)
                if sents:
                    files[k].write("\n".join(sents) + "\n")
                tokens[k] += ntok
                idx.write(f"{k if sents else 'skipped'}\t{len(sents)}\t{ntok}\t{path}\n")
                if log and (n + 1) % 50 == 0:
                    log(f"{n + 1}/{len(books)} books, {tokens['train']:,} training tokens")
    return tokens


__all__ = ["book_body", "paragraphs", "sentences", "list_books", "heldout_split", "build"]
