"""Importing NPLM text models: identical scores, clear errors on malformed files."""
from __future__ import annotations

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_VALID, make_model, read_lines
from nlmfeature.core import modelfile
from nlmfeature.cli import main
from nlmfeature.errors import InputError
from nlmfeature.training.nplm import read_nplm, write_nplm


def _nplm_score(cfg_model, hist, word):
    """NPLM's own computation (neuralLM::lookup_ngram, unnormalised, natural log) written
    from NPLM's text-format matrices: h1 = f(W1 [e_1 .. e_{n-1}] + b1), h2 = f(W2 h1 + b2)."""
    W1, b1, W2, b2, emb, Wout, bout, act = cfg_model
    x = np.concatenate([emb[w] for w in hist]).astype(np.float64)
    h = act(W1 @ x + b1)
    if W2 is not None:
        h = act(W2 @ h + b2)
    return float(Wout[word] @ h + bout[word])


@pytest.mark.parametrize("layers", [[12], []])
def test_converted_nplm_model_scores_exactly_as_nplm(tmp_path, layers):
    src = make_model(tmp_path, arch="nplm", order=5, word_width=8, hidden=20, hidden_layers=layers,
                     tables=False, min_count=4)
    header, arrays, _ = modelfile.read_model(src)
    original = nlmfeature.load(src)
    text = tmp_path / "model.nplm"
    write_nplm(str(text), header, arrays, list(original.vocab))
    assert text.read_text().startswith("\\config\nversion 1\n")
    out = tmp_path / "converted.nlm"
    assert main(["convert", str(text), str(out)]) == 0
    conv = nlmfeature.load(str(out))
    assert conv.header["precomputed"] and conv.vocab == original.vocab
    # an independent NPLM-semantics computation from the text file's own matrices
    E, n = 8, 5
    W1 = arrays["branch0.weights"].transpose(1, 0, 2).reshape(-1, (n - 1) * E).astype(np.float64)
    relu = lambda v: np.maximum(v, 0)
    ref = (W1, arrays["branch0.bias"], arrays.get("layer0.weight"), arrays.get("layer0.bias"),
           arrays["embeddings"], arrays["output.weight"], arrays["output.bias"], relu)
    for line in read_lines(BROWN_VALID, 20):
        toks = line.split()
        got = conv.score_sentence(toks)
        assert np.allclose(got, original.score_sentence(toks), atol=1e-5)
        ctx, words = conv.sentence_ngrams(toks)
        want = [_nplm_score(ref, c, w) for c, w in zip(ctx, words)]
        assert np.allclose(got, want, atol=1e-4)


def test_normalise_option_gives_a_softmax(tmp_path):
    src = make_model(tmp_path, arch="nplm", word_width=8, hidden=12, tables=False, min_count=6)
    header, arrays, _ = modelfile.read_model(src)
    text = tmp_path / "m.nplm"
    write_nplm(str(text), header, arrays, list(nlmfeature.load(src).vocab))
    h, a = read_nplm(str(text), normalise=True)
    assert h["output"]["type"] == "softmax"


def _write(tmp_path, body):
    p = tmp_path / "bad.nplm"
    p.write_text(body)
    return str(p)


GOOD_HEAD = ("\\config\nversion 1\nngram_size 3\nvocab_size 4\ninput_embedding_dimension 2\n"
             "num_hidden 0\noutput_embedding_dimension 2\nactivation_function rectifier\n\n"
             "\\vocab\n<unk>\n<s>\n</s>\n<null>\n\n")


@pytest.mark.parametrize("body,line,fragment", [
    ("hello\n", 1, "must start with \\config"),
    ("\\config\nversion 2\nngram_size 3\n\n", 4, "version 2"),
    (GOOD_HEAD + "\\input_embeddings\n1 2\n3 4\n5\n", 19, "columns"),
    (GOOD_HEAD + "\\input_embeddings\n1 2\n3 x\n", 18, "not a number"),
    (GOOD_HEAD + "\\input_embeddings\n1 2\n", 17, "truncated"),
    (GOOD_HEAD + "\\bogus section\n", 16, "unknown section"),
])
def test_malformed_nplm_files_name_file_and_line(tmp_path, body, line, fragment):
    path = _write(tmp_path, body)
    with pytest.raises(InputError) as info:
        read_nplm(path)
    assert info.value.path == path and info.value.line == line, str(info.value)
    assert fragment in str(info.value)
