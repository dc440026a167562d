"""--help never shows a path of the machine it runs on (the demo's work directory, the
README of the checkout) or development history: defaults are described, not expanded."""
from __future__ import annotations

import os
import re

from nlmfeature import cli
from nlmfeature.commands import base


def test_help_shows_no_machine_paths(monkeypatch, tmp_path):
    home = str(tmp_path / "some-home")
    monkeypatch.setenv("HOME", home)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "some-cache"))
    parser = cli.build_parser()
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    texts = [parser.format_help()] + [sp.format_help() for _, _, sp in base.subparsers(parser)]
    assert len(texts) > 20
    for text in texts:
        flat = " ".join(text.split())
        for machine_path in (home, str(tmp_path), checkout, os.path.expanduser("~") + "/"):
            assert machine_path not in flat, (machine_path, flat[:200])
        assert not re.search(r"[Ss]ession \d|[Ii]ssue \d", flat), flat[:200]
    demo = next(sp for path, _, sp in base.subparsers(parser) if path == ["demo"]).format_help()
    assert "~/.cache/nlmfeature/demo" in " ".join(demo.split())
