"""Reading text files line by line: the one place that does it.

Plain, gzip (``.gz``) or ``-`` (standard input); UTF-8 decoded one line at a time, so an
error names the exact line (a text-mode reader decodes ahead in blocks and would blame an
earlier one).  Every failure is an :class:`~nlmfeature.errors.InputError` naming file and line.
"""
from __future__ import annotations

import gzip
import sys
from typing import Iterator, Tuple

from .errors import InputError


def iter_lines(path: str) -> Iterator[Tuple[int, str]]:
    """(line number, line without its newline) of a text file, streaming."""
    try:
        if path == "-":
            f = sys.stdin.buffer
        elif path.endswith(".gz"):
            f = gzip.open(path, "rb")
        else:
            f = open(path, "rb")
    except OSError as exc:
        raise InputError(path, 0, f"cannot open: {exc.strerror or exc}") from None
    lineno = 0
    try:
        for lineno, raw in enumerate(f, 1):
            try:
                yield lineno, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise InputError(path, lineno, f"not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                                 "convert the file to UTF-8 (e.g. with iconv)") from None
    except (OSError, EOFError) as exc:  # e.g. a truncated or corrupt .gz
        raise InputError(path, lineno + 1, f"cannot read further: {exc}") from None
    finally:
        if f is not sys.stdin.buffer:
            f.close()
