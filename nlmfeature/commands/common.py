"""Helpers shared by the subcommands."""
from __future__ import annotations

from typing import Iterator

from ..textio import iter_lines


def read_lines(path: str) -> Iterator[str]:
    """Lines of a text file without their newline (see :func:`nlmfeature.textio.iter_lines`)."""
    for _, line in iter_lines(path):
        yield line
