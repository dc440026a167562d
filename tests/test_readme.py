"""Every nlmfeature command line the README shows parses with the real parsers (no stale flag
in the headline table, the recipes or the examples)."""
from __future__ import annotations

import os
import re
import shlex

import pytest

from nlmfeature import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_commands():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    text = text.split("<!-- command table")[0] + text.split("<!-- end of command table -->")[1]
    text = re.sub(r"\\\n\s*", " ", text)                        # continuation lines
    found = re.findall(r"`(nlmfeature [^`]+)`", text)
    found += [l.strip() for l in text.splitlines() if l.strip().startswith("nlmfeature ")]
    out = []
    for cmd in found:
        cmd = cmd.split("  #")[0].split(" # ")[0].strip()
        argv = shlex.split(cmd)[1:]
        if len(argv) > 1 and not argv[-1].startswith("<"):
            out.append(argv)
    return out


def test_readme_shows_the_recipes():
    argvs = readme_commands()
    used = {a[0] for a in argvs}
    assert {"prepare", "train", "rescore", "tune", "eval", "bench"} <= used, used
    assert len(argvs) >= 12


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_readme_command_parses(argv):
    args = cli.build_parser().parse_args(argv)
    assert callable(args.func)
