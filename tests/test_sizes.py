"""The one size rule (``4G``, ``500M``): :func:`nlmfeature.io.sizes.parse_size`, the ``SIZE``
flags of the command line, and the Moses and cdec features' ``persistent-cache-max`` parsers,
which must give the same bytes for the same text and refuse the same texts."""
from __future__ import annotations

import os
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


HARNESS = r"""
#define NLMFEATURE_CLIENT_PARSERS_ONLY
#include <iostream>
#include <stdexcept>
#include <string>
#include "nlmfeature_client.h"
int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    try { std::cout << nlmfeature::ParseSize("persistent-cache-max", line) << "\n"; }
    catch (const std::runtime_error &) { std::cout << "-1\n"; }
  }
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_the_decoder_features_parse_sizes_by_the_same_rule(tmp_path):
    """The C++ parser of the decoder features (nlmfeature_client.h's ParseSize: Moses, Moses2 and
    cdec's persistent-cache-max), compiled alone, gives parse_size's bytes and refuses (throws)
    what parse_size refuses."""
    cpp = tmp_path / "sizes.cpp"
    cpp.write_text(HARNESS, encoding="utf-8")
    exe = tmp_path / "sizes"
    capi = os.path.join(ROOT, "src", "nlmfeature", "decoder", "capi")
    subprocess.run(["c++", "-std=c++11", "-O1", "-I", capi, "-o", str(exe), str(cpp)], check=True,
                   capture_output=True)
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
