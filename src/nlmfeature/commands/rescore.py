"""``nlmfeature rescore``: the parser and the work are :mod:`nlmfeature.mt.rescore`'s (also the
``nlmfeature-rescore`` alias)."""
from __future__ import annotations

import argparse

from nlmfeature.mt.rescore import build_parser


def register(sub: argparse._SubParsersAction) -> None:
    build_parser(sub)
