"""The one size rule (``4G``, ``500M``): :func:`nlmfeature.io.sizes.parse_size`, the ``SIZE``
flags of the command line, and the Moses and cdec features' ``persistent-cache-max`` parsers,
which must give the same bytes for the same text and refuse the same texts."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from nlmfeature.cli import main as cli_main
from nlmfeature.errors import NLMFeatureError
from nlmfeature.io.sizes import MAX_SIZE, parse_size

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GOOD = {"500M": 500 << 20, "2G": 2 << 30, "4g": 4 << 30, "1024": 1024, "0": 0, "1.5KiB": 1536,
        "1.5kb": 1536, "3T": 3 << 40, "7B": 7, " 12 M ": 12 << 20, "0.5G": 1 << 29, "2.7": 2,
        "4GiB": 4 << 30, "4096k": 4 << 20}
BAD = ["", "lots", "-1G", "5.", ".5G", "1e3", "4 GG", "4X", "4iB", "4Gx", "G", "1,5G", "0x10",
       "9999999999T", "+4G", "nan", "inf", "4\u0663"]


@pytest.mark.parametrize("text,expected", sorted(GOOD.items()))
def test_parse_size_accepts(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", BAD)
def test_parse_size_refuses_with_the_text_in_the_message(text):
    with pytest.raises(NLMFeatureError, match="bad size"):
        parse_size(text)


def test_the_largest_size():
    assert parse_size(f"{MAX_SIZE}") == MAX_SIZE
    with pytest.raises(NLMFeatureError, match="larger than"):
        parse_size(f"{MAX_SIZE * 2}")


def test_a_bad_size_flag_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["cache", str(tmp_path), "--prune", "lots"])
    assert exc.value.code == 2
    assert "bad size 'lots'" in capsys.readouterr().err


def _function(path: str, signature: str) -> str:
    """The text of the C++ function starting with ``signature`` in ``path`` (up to its
    matching closing brace)."""
    text = open(path, encoding="utf-8").read()
    start = text.index(signature)
    depth, i = 0, text.index("{", start)
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return text[start:i]


HARNESS = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#define UTIL_THROW2(msg) do { std::ostringstream o_; o_ << msg; throw std::runtime_error(o_.str()); } while (0)
%s
int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    try { std::cout << ParseBytes(line) << "\n"; }
    catch (const std::runtime_error &) { std::cout << "-1\n"; }
  }
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
@pytest.mark.parametrize("source,signature", [("moses_ff/NLMFeature.cpp", "static int64_t ParseBytes("),
                                              ("cdec_ff/nlm_client.h", "inline int64_t ParseBytes(")])
def test_the_decoder_features_parse_sizes_by_the_same_rule(tmp_path, source, signature):
    """Each feature's parser, compiled alone, gives parse_size's bytes, and -1 (cdec) or an
    exception (Moses) where parse_size refuses the text."""
    code = _function(os.path.join(ROOT, source), signature)
    cpp = tmp_path / "sizes.cpp"
    cpp.write_text(HARNESS % re.sub(r"^(static|inline) ", "", code), encoding="utf-8")
    exe = tmp_path / "sizes"
    subprocess.run(["c++", "-O1", "-o", str(exe), str(cpp)], check=True, capture_output=True)
    texts = list(GOOD) + [t for t in BAD if "\n" not in t] + [f"{MAX_SIZE}", f"{MAX_SIZE * 2}"]
    out = subprocess.run([str(exe)], input="\n".join(texts) + "\n", capture_output=True, text=True,
                         check=True).stdout.split()
    want = []
    for t in texts:
        try:
            want.append(parse_size(t))
        except NLMFeatureError:
            want.append(-1)
    assert dict(zip(texts, map(int, out))) == dict(zip(texts, want))
