"""Helpers shared by the subcommands: opening text files (plain, .gz or '-')."""
from __future__ import annotations

import gzip
import io
import sys
from typing import Iterator, TextIO

from ..errors import InputError


def open_input(path: str) -> TextIO:
    """Open a UTF-8 text file for reading: ``-`` is standard input, ``.gz`` is decompressed."""
    try:
        if path == "-":
            return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="strict")
        if path.endswith(".gz"):
            return gzip.open(path, "rt", encoding="utf-8", errors="strict")
        return open(path, encoding="utf-8", errors="strict")
    except OSError as exc:
        raise InputError(path, 0, f"cannot open: {exc.strerror or exc}") from None


def read_lines(path: str) -> Iterator[str]:
    """Lines of a text file without their newline; a non-UTF-8 line is an error naming it.

    Lines are decoded one at a time, so the error names the exact line (a text-mode reader
    decodes ahead in blocks and would report an earlier one)."""
    try:
        if path == "-":
            f = sys.stdin.buffer
        elif path.endswith(".gz"):
            f = gzip.open(path, "rb")
        else:
            f = open(path, "rb")
    except OSError as exc:
        raise InputError(path, 0, f"cannot open: {exc.strerror or exc}") from None
    try:
        for lineno, raw in enumerate(f, 1):
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise InputError(path, lineno, f"not valid UTF-8 ({exc.reason}); "
                                 "convert the file to UTF-8 (e.g. with iconv)") from None
    except (OSError, EOFError) as exc:  # e.g. a truncated .gz
        raise InputError(path, 0, f"cannot read: {exc}") from None
    finally:
        if f is not sys.stdin.buffer:
            f.close()
