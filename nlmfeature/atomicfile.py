"""Atomic file writes: a temporary file in the target's directory, fsync, ``os.replace``.

A reader (or a crash) sees the old file or the new one, never half of one.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import BinaryIO, Iterator


@contextlib.contextmanager
def atomic_open(path: str, suffix: str = "") -> Iterator[BinaryIO]:
    """A binary file to write; on a clean exit it replaces ``path``, on an error it is removed."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=suffix, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))
