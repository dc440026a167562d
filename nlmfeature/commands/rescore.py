"""``nlmfeature rescore``: the parser and the work are :mod:`nlmfeature.rescore`'s (also the
``nlmfeature-rescore`` alias)."""
from __future__ import annotations

import argparse

from ..rescore import build_parser


def register(sub: argparse._SubParsersAction) -> None:
    build_parser(sub)
