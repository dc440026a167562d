"""What a newcomer trips on, each with a test: the Python API's string handling, the README's
examples, silent nonsense (OOV-heavy rescoring, a KenLM model for another vocabulary or
without <unk>), progress output in log files, a fast second set-up run, CI's test command."""
from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_TRAIN, BROWN_VALID, DATA, make_model, read_lines
from nlmfeature.core.architecture import ModelSpec, random_model
from nlmfeature.errors import InputError
from nlmfeature.core.vocab import Vocabulary, count_words

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
KBEST = os.path.join(DATA, "kbest", "moses-multi30k-dev10.100best.gz")
ENV = dict(os.environ, PYTHONPATH=ROOT)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return nlmfeature.load(make_model(tmp_path_factory.mktemp("api"), output="class", classes=20))


# -- strings where tokens are expected --------------------------------------------------------------
def test_score_splits_a_string_context_on_white_space(lm):
    s = lm.score_ngram("the jury", "said")
    assert s == lm.score_ngram(["the", "jury"], "said") == lm.score_ngram(("the", "jury"), "said")
    # not the characters of the string (what it used to score)
    assert s != pytest.approx(lm.score_ngram(list("the jury"), "said"), abs=1e-6)
    assert lm.score_ngram("", "said") == lm.score_ngram([], "said")
    assert np.array_equal(lm.ids("the jury"), lm.ids(["the", "jury"]))
    assert np.array_equal(lm.vocab.ids("the jury"), lm.ids(["the", "jury"]))


@pytest.mark.parametrize("context,word,error", [
    ("the jury", "said it", ValueError),       # a word is one token
    ("the jury", ["said"], TypeError),
    (5, "said", TypeError),
    (b"the jury", "said", TypeError),
    (["the", 3], "said", TypeError),
])
def test_score_refuses_what_is_not_tokens(lm, context, word, error):
    with pytest.raises(error):
        lm.score_ngram(context, word)


def test_perplexity_takes_a_path_lines_or_a_file(lm, tmp_path):
    by_path = lm.perplexity(BROWN_VALID)
    lines = read_lines(BROWN_VALID)
    assert by_path.sentences == len(lines) and by_path.tokens == sum(len(l.split()) + 1 for l in lines)
    with open(BROWN_VALID, encoding="utf-8") as f:
        by_file = lm.perplexity(f)
    by_lines = lm.perplexity(lines)
    by_tokens = lm.perplexity([l.split() for l in lines])
    import pathlib

    by_pathlib = lm.perplexity(pathlib.Path(BROWN_VALID))
    gz = tmp_path / "valid.txt.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    by_gz = lm.perplexity(str(gz))
    for other in (by_file, by_lines, by_tokens, by_pathlib, by_gz):
        assert other.tokens == by_path.tokens and other.oovs == by_path.oovs
        assert other.perplexity == pytest.approx(by_path.perplexity, rel=1e-12)
    # the file name is not scored as a sentence any more: a missing file is an error naming it
    with pytest.raises(InputError, match="no-such-file.txt"):
        lm.perplexity(str(tmp_path / "no-such-file.txt"))
    with pytest.raises(TypeError):
        lm.perplexity(42)


def test_score_batch_refuses_words_and_takes_sentence_ngrams(lm):
    ctx, words = lm.sentence_ngrams("the jury said")
    np.testing.assert_allclose(lm.score_batch(ctx, words), lm.score_sentence("the jury said"),
                               atol=1e-5)
    with pytest.raises(TypeError, match="sentence_ngrams"):
        lm.score_batch([["the", "jury", "said"]], ["it"])
    with pytest.raises(TypeError):
        lm.score_batch(ctx.astype(np.float32), words)
    with pytest.raises(TypeError):
        lm.score_sentences("the jury said")


def test_state_scoring_as_kenlm(lm):
    """KenLM's shape: BeginSentenceWrite + BaseScore(in_state, word, out_state)."""
    for sent in read_lines(BROWN_VALID, 20):
        state = lm.begin_sentence()
        total = 0.0
        for w in sent.split() + ["</s>"]:
            s, state = lm.score_word(state, w)
            total += s
        assert total == pytest.approx(lm.sentence_logprob(sent), abs=1e-4)
    # no history: <null> padding, as score() with a short context
    s, st = lm.score_word(lm.null_context(), "jury")
    assert s == pytest.approx(lm.score_ngram([], "jury"), abs=1e-6)
    s2, _ = lm.score_word(st, "said")
    assert s2 == pytest.approx(lm.score_ngram(["jury"], "said"), abs=1e-6)
    assert lm.begin_sentence() == lm.begin_sentence() and hash(st)
    with pytest.raises(TypeError):
        lm.score_word(("the",), "jury")


# -- every README example runs ---------------------------------------------------------------------
def test_readme_python_example_runs(lm, tmp_path, monkeypatch):
    text = open(README, encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "no python example in README.md"
    shutil.copy(lm.path, tmp_path / "model.nlm")
    shutil.copy(BROWN_VALID, tmp_path / "test.txt")
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        ns: dict = {}
        exec(compile(code, "README.md", "exec"), ns)
    m = ns["lm"]
    # what the comments claim
    assert ns["total"] == pytest.approx(m.sentence_logprob("the jury said"), abs=1e-4)
    assert list(m.vocab)[:4] == ["<unk>", "<s>", "</s>", "<null>"]
    assert m.perplexity("test.txt").tokens == lm.perplexity(BROWN_VALID).tokens


def test_readme_test_command_is_what_ci_runs():
    readme = open(README, encoding="utf-8").read()
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    commands = re.findall(r"^    (bash tools/setup\.sh && python3 -m pytest .*)$", readme, re.M)
    assert len(commands) == 1, commands
    assert commands[0] in ci.splitlines()
    assert "-rs" in commands[0] and "--durations=20" in commands[0]


def test_decoder_tests_are_marked(pytestconfig):
    assert any(m.startswith("decoder:") for m in pytestconfig.getini("markers"))
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "decoder",
                        "tests/test_moses_shim.py", "tests/test_cdec_shim.py", "tests/test_bleu.py",
                        "tests/test_tuning_driver.py"],
                       capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=300)
    ids = [l for l in r.stdout.splitlines() if "::" in l]
    assert ids and all("shim" in i or "real_moses" in i or "real_cdec" in i for i in ids), r.stdout
    assert any("moses_shim" in i for i in ids) and any("cdec_shim" in i for i in ids)
    assert {i.split("::")[1] for i in ids if "tuning_driver" in i} == \
        {"test_driver_with_real_moses", "test_driver_with_real_cdec"}


# -- silent nonsense -------------------------------------------------------------------------------
def _kbest_vocab_model(tmp_path) -> str:
    """A model whose vocabulary is the k-best list's own words (random weights)."""
    texts = [l.split(" ||| ")[1] for l in gzip.open(KBEST, "rt", encoding="utf-8")]
    counts = count_words(texts)
    vocab = Vocabulary.from_counts(counts, min_count=1)
    header, arrays = random_model(ModelSpec(arch="lbl", order=3, word_width=8, diagonal_contexts=True,
                                            output="unnormalised"), vocab,
                                  np.array([counts.get(w, 1) for w in vocab], dtype=np.float64), seed=0)
    path = str(tmp_path / "own.nlm")
    nlmfeature.save(path, header, arrays)
    return path


def test_rescoring_with_a_foreign_vocabulary_warns(tmp_path, capsys):
    from nlmfeature.mt.rescore import rescore

    brown = make_model(tmp_path)             # Brown vocabulary on a Multi30k list: 25% OOV
    st = rescore(KBEST, str(tmp_path / "a.gz"), [brown], progress=False)
    err = capsys.readouterr().err
    assert st.oov_rates()[0] > 0.2
    assert "warning:" in err and "not in the vocabulary of" in err and brown in err
    assert f"{100 * st.oov_rates()[0]:.1f}%" in err
    # a model of the list's own words: no warning
    st = rescore(KBEST, str(tmp_path / "b.gz"), [_kbest_vocab_model(tmp_path)], progress=False)
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


# -- progress in log files ---------------------------------------------------------------------------
def test_progress_is_plain_lines_when_not_a_terminal(monkeypatch):
    from nlmfeature.io.progress import PlainProgress, progress

    buf = io.StringIO()
    bar = progress(total=10, desc="work", unit="item", file=buf)
    assert isinstance(bar, PlainProgress)
    bar.interval = 0.0
    for _ in range(10):
        bar.update(1)
    bar.close()
    out = buf.getvalue()
    assert "\r" not in out and out.count("\n") == 11
    assert out.splitlines()[0].startswith("work: 1/10 item (10.0%)")
    assert out.splitlines()[-1].startswith("work: done, 10/10 item (100.0%)")
    quiet = io.StringIO()
    with progress(total=3, desc="short", file=quiet) as b:   # shorter than one interval: silent
        b.update(3)
    assert quiet.getvalue() == ""


def test_rescore_progress_in_a_log_file(tmp_path):
    model = make_model(tmp_path)
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", model, "-i",
                            KBEST, "-o", str(tmp_path / "o.gz"), "--chunk-size", "100"],
                           stderr=f, cwd=ROOT, timeout=300,
                           env=dict(ENV, NLMFEATURE_PROGRESS_INTERVAL="0"))
    assert r.returncode == 0
    text = log.read_text()
    assert "\r" not in text and "\x1b" not in text
    progress_lines = [l for l in text.splitlines() if l.startswith("rescoring: ")]
    assert len(progress_lines) >= 5 and "hyp/s" in progress_lines[0]
    # -q: no progress and no summary; what is left on stderr are warnings (here: none)
    r = subprocess.run([sys.executable, "-m", "nlmfeature.cli", "rescore", "-m", _kbest_vocab_model(tmp_path),
                        "-i", KBEST, "-o", str(tmp_path / "q.gz"), "--chunk-size", "100", "-q"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=dict(ENV, NLMFEATURE_PROGRESS_INTERVAL="0"))
    assert r.returncode == 0 and r.stderr == ""


# -- a second set-up run only checks ------------------------------------------------------------------
def _copy_build_inputs(dst):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import install_stamp

    for rel in install_stamp.build_inputs(ROOT):
        os.makedirs(os.path.dirname(os.path.join(dst, rel)) or dst, exist_ok=True)
        shutil.copy(os.path.join(ROOT, rel), os.path.join(dst, rel))
    return install_stamp


def test_install_stamp_follows_the_build_sources(tmp_path):
    st = _copy_build_inputs(str(tmp_path))
    root = str(tmp_path)
    assert any(p.endswith(".pyx") for p in st.build_inputs(root)) and "setup.py" in st.build_inputs(root)
    assert "no record" in st.why_not_current(root)
    st.record(root)
    before = st.stamp(root)
    os.makedirs(tmp_path / "nlmfeature", exist_ok=True)
    (tmp_path / "nlmfeature" / "model.py").write_text("# python sources need no rebuild\n")
    assert st.stamp(root) == before
    # the copy is not the installed package, so it is never "current"
    assert "not this checkout" in st.why_not_current(root) or "does not import" in st.why_not_current(root)
    pyx = next(p for p in st.build_inputs(root) if p.endswith(".pyx"))
    with open(os.path.join(root, pyx), "a") as f:
        f.write("\n# changed\n")
    assert st.stamp(root) != before
    assert "changed" in st.why_not_current(root)


def test_second_setup_run_only_checks():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import install_stamp

    reason = install_stamp.why_not_current(ROOT)
    if reason:
        pytest.skip(f"tools/setup.sh has not installed this checkout ({reason})")
    r = subprocess.run(["bash", "tools/setup.sh"], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert "nothing to rebuild" in r.stderr and "installing" not in r.stderr
