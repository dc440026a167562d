"""Reading text files: the one place in the package that does it.

Plain files, compressed ones (``.gz``, ``.bz2``, ``.xz``, by name) and ``-`` (standard input)
are read as UTF-8, one line at a time, so an error names the exact line (a text-mode reader
decodes ahead in blocks and would blame an earlier one).  Every failure is an
:class:`~nlmfeature.errors.InputError` naming the file and line:

* a missing or unreadable file, a directory;
* a non-regular file (character device such as ``/dev/zero``, socket, FIFO): refused before it
  is opened, since reading one may block forever or never end.  A command that streams its
  input (rescoring a k-best list, scoring text) passes ``stream=True`` to accept a FIFO (a
  named pipe a decoder writes into) as well as ``-``;
* a corrupt or truncated compressed stream (zlib, bz2 and lzma errors, unexpected EOF);
* bytes that are not UTF-8;
* a line longer than :data:`MAX_LINE` bytes (memory stays bounded on binary junk).

One tokenisation rule for every reader (training, scoring, rescoring, clustering, the
decoders' shims): a UTF-8 byte-order mark at the start of a file is not text (it is
dropped), and tokens are separated by runs of ASCII white space -- space, tab, CR, LF,
vertical tab, form feed (C's ``isspace``, what Moses and cdec split on).  Other Unicode
spaces (U+00A0, U+3000, ...) are parts of words, as they are to a decoder.  See
:func:`split_tokens`.
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import stat
import sys
import zlib
from typing import IO, Iterator, List, Tuple

from nlmfeature.errors import InputError

#: longest line accepted, in bytes (a k-best line of a 500-word hypothesis is ~20 KB)
MAX_LINE = 64 << 20
#: bytes read at a time
CHUNK = 1 << 20
#: compressed formats, by file name ending
COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
#: what a broken compressed stream raises (gzip: BadGzipFile (an OSError) or zlib.error)
_STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)


#: the white space that separates tokens (C's isspace: what decoders split on)
ASCII_SPACE = " \t\n\r\x0b\x0c"
_ASCII_SPACE_RUN = re.compile("[ \t\n\r\x0b\x0c]+")
#: what str.split() also splits on but a decoder does not (not ASCII white space)
_OTHER_SPACE = re.compile("[\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
#: the UTF-8 byte-order mark, as bytes and decoded
BOM, BOM_TEXT = b"\xef\xbb\xbf", "\ufeff"


def split_tokens(line: str) -> List[str]:
    """The tokens of a line: split on runs of ASCII white space only (see the module doc);
    a U+00A0 or U+3000 inside a token stays in it."""
    if _OTHER_SPACE.search(line) is None:   # the common case: str.split agrees, and is fast
        return line.split()
    return [t for t in _ASCII_SPACE_RUN.split(line) if t]


def check_input(path: str, stream: bool = False) -> None:
    """Raise :class:`InputError` unless ``path`` is a readable regular file (or, with
    ``stream``, a FIFO); ``-`` is always accepted.  Nothing is opened."""
    if path == "-":
        return
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a path must be a str, not {type(path).__name__}")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(path, 0, f"cannot open: {exc.strerror or exc}") from None
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise InputError(path, 0, "is a directory, not a file")
    if stat.S_ISFIFO(st.st_mode) and stream:
        return
    kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else
            "a character device" if stat.S_ISCHR(st.st_mode) else
            "a block device" if stat.S_ISBLK(st.st_mode) else
            "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
    hint = ("; this input is read more than once or whole: write it to a file first"
            if stat.S_ISFIFO(st.st_mode) else "")
    raise InputError(path, 0, f"is {kind}, not a regular file{hint}")


def open_binary(path: str, stream: bool = False) -> IO[bytes]:
    """The (decompressed) bytes of a file after :func:`check_input`; ``-`` is standard input
    (not closed by the caller's ``with``: use :func:`iter_lines` when possible)."""
    check_input(path, stream)
    if path == "-":
        return _Unclosed(sys.stdin.buffer)
    opener = COMPRESSED.get(os.path.splitext(str(path))[1], open)
    try:
        return opener(path, "rb")
    except OSError as exc:
        raise InputError(path, 0, f"cannot open: {exc.strerror or exc}") from None


class _Unclosed:
    """A binary stream whose ``close`` does nothing (standard input)."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __iter__(self):
        return iter(self._f)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def close(self) -> None:
        pass


def iter_lines(path: str, stream: bool = False) -> Iterator[Tuple[int, str]]:
    """(line number, line without its newline) of a text file, streaming in constant memory.

    ``stream``: also accept a FIFO (for commands whose input is a stream, such as a k-best
    list piped from a decoder); ``-`` (standard input) is always accepted.

    The bytes are read in blocks of whole lines, decoded and split at once (a block that is
    not UTF-8 is decoded line by line to name the line); a trailing ``\r`` is dropped.
    """
    f = open_binary(path, stream)
    lineno = 0
    try:
        read = getattr(f, "read1", f.read)      # read1: what is there (a pipe need not fill)
        rest = b""
        first = True
        while True:
            try:
                data = read(CHUNK)
            except _STREAM_ERRORS as exc:   # e.g. a truncated or corrupt compressed file
                raise InputError(path, lineno + 1, f"cannot read further: {_reason(exc)}"
                                 ) from None
            if not data:
                if rest:
                    yield lineno + 1, _decode(rest, path, lineno + 1).rstrip("\r")
                return
            buf = rest + data if rest else data
            if first and (len(buf) >= len(BOM) or not BOM.startswith(buf)):
                first = False
                if buf.startswith(BOM):        # a byte-order mark is not text
                    buf = buf[len(BOM):]
            cut = buf.rfind(b"\n")
            if cut < 0:
                rest = buf
                if len(rest) > MAX_LINE:
                    raise InputError(path, lineno + 1, f"line longer than {MAX_LINE >> 20} MiB: "
                                     "not a text file of this kind?")
                continue
            rest = buf[cut + 1:]
            try:
                lines = buf[:cut].decode("utf-8").split("\n")
            except UnicodeDecodeError:
                lines = [_decode(raw, path, lineno + k + 1)
                         for k, raw in enumerate(buf[:cut].split(b"\n"))]
            if b"\r" in buf:
                lines = [line.rstrip("\r") for line in lines]
            for line in lines:
                lineno += 1
                yield lineno, line
    finally:
        f.close()


def _decode(raw: bytes, path: str, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, lineno, f"not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                         "convert the file to UTF-8 (e.g. with iconv)") from None


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, EOFError):
        return f"the compressed stream ends early (truncated file?): {text}"
    if isinstance(exc, (zlib.error, lzma.LZMAError, gzip.BadGzipFile)):
        return f"corrupt compressed data: {text}"
    return getattr(exc, "strerror", None) or text


def read_lines(path: str, stream: bool = False) -> List[str]:
    """All lines of a text file without their newlines (see :func:`iter_lines`)."""
    return [line for _, line in iter_lines(path, stream)]


def read_tokens(path: str, stream: bool = False) -> List[List[str]]:
    """Tokenised lines of a text file (:func:`split_tokens`; empty lines give empty lists)."""
    return [split_tokens(line) for _, line in iter_lines(path, stream)]


def read_head(path: str, size: int) -> bytes:
    """Up to ``size`` leading (decompressed) bytes of a regular file (for format sniffing);
    ``b""`` when it cannot be read."""
    try:
        with open_binary(path) as f:
            return f.read(size)
    except (InputError,) + _STREAM_ERRORS:
        return b""
