"""Silent nonsense is refused or warned about: rescoring with a model of another vocabulary,
a KenLM model without <unk>, a KenLM model of another vocabulary."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_TRAIN, BROWN_VALID, DATA, kbest_vocab_model, make_model, read_lines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KBEST = os.path.join(DATA, "kbest", "moses-multi30k-dev10.100best.gz")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return nlmfeature.load(make_model(tmp_path_factory.mktemp("api"), output="class", classes=20))


# -- silent nonsense -------------------------------------------------------------------------------
def test_rescoring_with_a_foreign_vocabulary_warns(tmp_path, capsys):
    from nlmfeature.mt.rescore import rescore

    brown = make_model(tmp_path)             # Brown vocabulary on a Multi30k list: 25% OOV
    st = rescore(KBEST, str(tmp_path / "a.gz"), [brown], progress=False)
    err = capsys.readouterr().err
    assert st.oov_rates()[0] > 0.2
    assert "warning:" in err and "not in the vocabulary of" in err and brown in err
    assert f"{100 * st.oov_rates()[0]:.1f}%" in err
    # a model of the list's own words: no warning
    st = rescore(KBEST, str(tmp_path / "b.gz"), [kbest_vocab_model(tmp_path, KBEST)], progress=False)
    assert st.oovs == [0] and "warning" not in capsys.readouterr().err


def _kenlm_ready() -> str:
    from nlmfeature.errors import NLMFeatureError
    from nlmfeature.training.kenlm_baseline import find_tool

    try:
        find_tool("lmplz")
        import kenlm  # noqa: F401
    except (NLMFeatureError, ImportError) as exc:
        return str(exc)
    return ""


needs_kenlm = pytest.mark.skipif(bool(_kenlm_ready()), reason=f"KenLM not built: {_kenlm_ready()}")


@needs_kenlm
def test_arpa_without_unk_is_refused(lm, tmp_path, capsys):
    from nlmfeature.cli import main
    from nlmfeature.training.kenlm_baseline import train_kenlm

    text = tmp_path / "train.txt"
    text.write_text("\n".join(read_lines(BROWN_TRAIN)[:400]) + "\n", encoding="utf-8")
    arpa = tmp_path / "with-unk.arpa"
    train_kenlm(str(text), str(arpa), 3)                 # KenLM's own vocabulary and <unk>
    lines = arpa.read_text(encoding="utf-8").splitlines()
    unk = [i for i, l in enumerate(lines) if l.split("\t")[1:2] == ["<unk>"]]
    assert len(unk) == 1
    del lines[unk[0]]
    lines = [re.sub(r"^ngram 1=(\d+)$", lambda m: f"ngram 1={int(m.group(1)) - 1}", l) for l in lines]
    no_unk = tmp_path / "no-unk.arpa"
    no_unk.write_text("\n".join(lines) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["perplexity", "-m", lm.path, "--test", BROWN_VALID, "--kenlm", str(arpa), "-q"]) == 0
    assert main(["perplexity", "-m", lm.path, "--test", BROWN_VALID, "--kenlm", str(no_unk), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"{no_unk}: the ARPA file has no <unk> entry" in err and "meaningless" in err


@needs_kenlm
def test_kenlm_for_another_vocabulary_warns(lm, tmp_path, capsys):
    from nlmfeature.cli import main
    from nlmfeature.training.kenlm_baseline import train_kenlm

    ours = tmp_path / "brown.arpa"
    train_kenlm(BROWN_TRAIN, str(ours), 3, vocab=lm.vocab)
    # lowercased tokenised Multi30k English: another text, another casing
    other = tmp_path / "multi30k.arpa"
    train_kenlm(os.path.join(DATA, "tuning", "multi30k.dev.ref.200.en"), str(other), 3)
    capsys.readouterr()
    assert main(["perplexity", "-m", lm.path, "--test", BROWN_VALID, "--kenlm", str(ours), "-q"]) == 0
    captured = capsys.readouterr()
    assert "another vocabulary" not in captured.err + captured.out
    assert main(["perplexity", "-m", lm.path, "--test", BROWN_VALID, "--kenlm", str(other), "-q"]) == 0
    captured = capsys.readouterr()
    assert "warning:" in captured.err and "built for another vocabulary" in captured.err
    assert "built for another vocabulary" in captured.out      # in the table's notes too


