"""The decoder boundary: model files that pass the checksum but are malformed,
odd arguments to every scoring entry, NPLM imports, and a model file overwritten under a
running process.  Each case must give a clear error naming the file, or correct scores;
never a crash, a hang or a wrong score.  C API cases run tests/c/test_capi.c."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_VALID, make_model, read_lines
from nlmfeature.core import modelfile
from nlmfeature.errors import InputError, ModelFileError
from nlmfeature.training.nplm import read_nplm, write_nplm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modelbytes  # noqa: E402

SENTENCES = read_lines(BROWN_VALID, 12)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("boundary")
    return {
        "unnormalised": make_model(d, "unnorm.nlm", order=4, min_count=4),
        "class": make_model(d, "class.nlm", order=4, output="class", classes=20, seed=3, min_count=4),
        "tree": make_model(d, "tree.nlm", order=3, output="tree", seed=4, min_count=4),
        "other": make_model(d, "other.nlm", order=4, seed=9, min_count=6, word_width=8),
    }


def _mutated(tmp_path, src, name="bad.nlm", **kw) -> str:
    path = str(tmp_path / name)
    with open(src, "rb") as f:
        raw = f.read()
    with open(path, "wb") as f:
        f.write(modelbytes.rewrite(raw, **kw))
    return path


def _refused(path, *fragments):
    with pytest.raises(ModelFileError) as info:
        nlmfeature.load(path)
    msg = str(info.value)
    assert path in msg, msg
    for frag in fragments:
        assert frag in msg, msg
    return msg


def _int32(edit):
    """An array edit on int32 elements."""
    def run(buf, e):
        a = np.frombuffer(buf, dtype="<i4", count=e["nbytes"] // 4, offset=e["start"]).copy()
        edit(a)
        buf[e["start"]:e["start"] + e["nbytes"]] = a.tobytes()
    return run


# -- case 1: vocab.hash is checked, not trusted -----------------------------------------------

def _hash_cases(V):
    def empty(a):
        a[:] = -1

    def beyond(a):
        a[np.flatnonzero(a >= 0)[0]] = V + 1000

    def full(a):
        a[a < 0] = 5  # no empty slot: a probe for an absent word never stops

    def moved(a):
        i = np.flatnonzero(a >= 0)[:2]
        a[i[0]], a[i[1]] = a[i[1]], a[i[0]]
    return {"empty": empty, "entry-beyond-V": beyond, "no-empty-slot": full, "swapped": moved}


@pytest.mark.parametrize("case", ["empty", "entry-beyond-V", "no-empty-slot", "swapped", "not-power-of-two"])
def test_case1_vocab_hash_is_checked(models, tmp_path, case):
    V = len(nlmfeature.load(models["unnormalised"]).vocab)
    if case == "not-power-of-two":
        def shrink(h):
            e = h["arrays"]["vocab.hash"]
            e["shape"] = [e["shape"][0] - 3]
            e["nbytes"] -= 12
        path = _mutated(tmp_path, models["unnormalised"], change_header=shrink)
    else:
        path = _mutated(tmp_path, models["unnormalised"], arrays={"vocab.hash": _int32(_hash_cases(V)[case])})
    _refused(path, "vocab.hash")


# -- case 2: class.members in another order --------------------------------------------------

def test_case2_class_members_out_of_order_are_refused(models, tmp_path):
    m = nlmfeature.load(models["class"])
    st = m.arrays["class.start"]
    c = int(np.argmax(np.diff(st)))  # the largest class, consecutive ids in a frequency-binned model

    def reverse(a):
        a[st[c]:st[c + 1]] = a[st[c]:st[c + 1]][::-1].copy()
    path = _mutated(tmp_path, models["class"], arrays={"class.members": _int32(reverse)})
    _refused(path, "class.members", "ascending")


def test_case2_wrapping_offsets_are_refused(models, tmp_path):
    """Offsets whose int32 differences wrap round (0, 2^31-1, -2^31+5, -1, V: every difference
    "positive" modulo 2^32) are refused, not expanded into a 32 GiB array (found by
    tests/fuzz.py, seed 8, case 11471: a MemoryError instead of a clear error)."""
    V = len(nlmfeature.load(models["class"]).vocab)

    def wrap(a):
        a[:4] = [0, 2**31 - 1, -2**31 + 5, -1]
        a[4:-1] = np.arange(len(a) - 5)
        a[-1] = V
        with np.errstate(over="ignore"):
            assert np.all(np.diff(a) > 0)        # what the old check saw
    path = _mutated(tmp_path, models["class"], arrays={"class.start": _int32(wrap)})
    _refused(path, "class")


# -- case 3: malformed headers -----------------------------------------------------------------

def _deep(n):
    return b'{"a":' * n + b"1" + b"}" * n


HEADER_CASES = {
    "output-is-a-list": (lambda h: h.__setitem__("output", []), "output"),
    "arrays-is-a-list": (lambda h: h.__setitem__("arrays", list(h["arrays"].values())), "array table"),
    "order-is-a-string": (lambda h: h.__setitem__("order", str(h["order"])), "order"),
    "order-is-a-float": (lambda h: h.__setitem__("order", float(h["order"])), "order"),
    "order-17": (lambda h: h.__setitem__("order", 17), "order"),
    "negative-shape": (lambda h: h["arrays"]["unigram"].__setitem__("shape", [-1]), "unigram"),
    "huge-shape": (lambda h: h["arrays"]["embeddings"].__setitem__("shape", [1 << 40, 1 << 40]), "embeddings"),
    "negative-nbytes": (lambda h: h["arrays"]["unigram"].update(shape=[-1], nbytes=-4), "unigram"),
    "header-is-a-list": (lambda h: [h], "JSON object"),
    "branches-not-objects": (lambda h: h.__setitem__("branches", [1, 2]), "branch"),
    "special-moved": (lambda h: h["special"].__setitem__("<unk>", 5), "0-3"),
    "bool-vocab-size": (lambda h: h.__setitem__("vocab_size", True), "vocab_size"),
    "dtype-is-a-number": (lambda h: h["arrays"]["unigram"].__setitem__("dtype", 4), "unigram"),
    "big-endian": (lambda h: h["arrays"]["unigram"].__setitem__("dtype", ">f4"), "unigram"),
    "direct-hash-space-0": (lambda h: h.__setitem__("direct", {"order": 2, "hash_space": 0}), "hash_space"),
}


@pytest.mark.parametrize("case", list(HEADER_CASES))
def test_case3_malformed_headers_name_the_file(models, tmp_path, case):
    change, fragment = HEADER_CASES[case]
    path = _mutated(tmp_path, models["unnormalised"], change_header=change)
    _refused(path, fragment)


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_case3_deeply_nested_header(models, tmp_path, depth):
    path = _mutated(tmp_path, models["unnormalised"], header_bytes=_deep(depth))
    _refused(path, "header")


def test_case3_bad_trees_are_refused(models, tmp_path):
    m = nlmfeature.load(models["tree"])
    ps = m.arrays["tree.path_start"]

    def flip_sign(buf, e):  # two words end on the same leaf: probabilities no longer sum to one
        w = int(np.argmax(np.diff(ps)))
        pos = e["start"] + int(ps[w + 1]) - 1
        buf[pos] = (256 - buf[pos]) % 256  # +1 <-> -1 (int8)
    path = _mutated(tmp_path, models["tree"], arrays={"tree.path_sign": flip_sign})
    _refused(path, "tree")


# -- case 4: out-of-range ids, null pointers, calls out of order ----------------------------------

def test_case4_cached_scorer_maps_out_of_range_ids_to_unk(models):
    from nlmfeature.decoder.pcache import CachedScorer
    m = nlmfeature.load(models["class"])
    V, c = len(m.vocab), m.order - 1
    cs = CachedScorer(m)
    cs.begin(0)
    bad = np.array([[V, -1, 1 << 30], [2**31 - 1, -(2**31), V + 5]], dtype=np.int32)[:, :c]
    got = cs.score_padded(np.ascontiguousarray(bad), np.array([V + 9, -7], dtype=np.int32))
    unk = np.full_like(bad, m.vocab.unk)
    want = cs.score_padded(np.ascontiguousarray(unk), np.array([m.vocab.unk] * 2, dtype=np.int32))
    assert np.array_equal(got, want) and np.all(np.isfinite(got))
    # and equal to the batched (matrix) scorer on the mapped ids
    assert np.allclose(got, m.score_batch(unk, np.array([m.vocab.unk] * 2, dtype=np.int32)), atol=1e-5)
    cs.end()


# -- case 7: NPLM import puts the special words at ids 0-3 ----------------------------------------

def _nplm_text(tmp_path, model_path, words_order=None) -> tuple:
    """An NPLM text model written from an nlmfeature NPLM-architecture model, with its
    vocabulary (and rows) in ``words_order`` (a permutation of ids)."""
    header, arrays, _ = modelfile.read_model(model_path)
    words = list(nlmfeature.load(model_path).vocab)
    arrays = dict(arrays)
    if words_order is not None:
        perm = np.asarray(words_order)
        words = [words[i] for i in perm]
        for name in ("embeddings", "output.weight", "output.bias"):
            arrays[name] = np.ascontiguousarray(arrays[name][perm])
    path = tmp_path / "model.nplm"
    write_nplm(str(path), header, arrays, words)
    return str(path), words


def test_case7_nplm_import_maps_specials_to_0_3(tmp_path):
    src = make_model(tmp_path, arch="nplm", order=4, word_width=8, hidden=12, hidden_layers=[10],
                     tables=False, min_count=6)
    V = len(nlmfeature.load(src).vocab)
    order = list(range(4, V)) + [2, 0, 3, 1]  # as NPLM lists them: specials anywhere, here last
    text, words = _nplm_text(tmp_path, src, order)
    assert words.index("<unk>") != 0
    out = str(tmp_path / "conv.nlm")
    from nlmfeature.cli import main
    assert main(["convert", text, out]) == 0
    conv = nlmfeature.load(out)
    assert conv.header["special"] == {"<unk>": 0, "<s>": 1, "</s>": 2, "<null>": 3}
    assert list(conv.vocab)[:4] == ["<unk>", "<s>", "</s>", "<null>"]
    original = nlmfeature.load(src)
    for line in SENTENCES:
        assert np.allclose(conv.score_sentence(line), original.score_sentence(line), atol=1e-5)


# -- case 8: NPLM files with absurd sizes or malformed content ---------------------------------

NPLM_HEAD = ("\\config\nversion 1\nngram_size {n}\nvocab_size {V}\ninput_embedding_dimension {E}\n"
             "num_hidden 0\noutput_embedding_dimension 2\nactivation_function rectifier\n\n")
VOCAB = "\\vocab\n<unk>\n<s>\n</s>\n<null>\n\n"


@pytest.mark.parametrize("body,fragment", [
    (NPLM_HEAD.format(n=1000000000, V=4, E=2) + VOCAB + "\\input_embeddings\n", "ngram_size"),
    (NPLM_HEAD.format(n=17, V=4, E=2) + VOCAB, "orders 2 to 16"),
    (NPLM_HEAD.format(n=3, V=4, E=2**20) + VOCAB + "\\input_embeddings\n1 2\n", "can hold"),
    (NPLM_HEAD.format(n=3, V=2**30, E=2) + VOCAB, "announces"),
    (NPLM_HEAD.format(n=3, V="many", E=2) + VOCAB, "not an integer"),
    (NPLM_HEAD.format(n=3, V=4, E=-2) + VOCAB, "outside"),
    (NPLM_HEAD.format(n=3, V=4, E=2) + "\\vocab\n<unk>\n<s>\n<s>\n<null>\n\n", "twice"),
    (NPLM_HEAD.format(n=3, V=4, E=2) + VOCAB + "\\input_embeddings\n1 2\nnan 1\n0 0\n0 0\n\n", "finite"),
    (NPLM_HEAD.format(n=3, V=4, E=2) + VOCAB + "\\input_embeddings\n1 2\n1e39 1\n0 0\n0 0\n\n", "finite"),
])
def test_case8_malformed_nplm_files_are_clear_errors(tmp_path, body, fragment):
    p = tmp_path / "bad.nplm"
    p.write_text(body)
    t0 = time.time()
    with pytest.raises(InputError) as info:
        read_nplm(str(p))
    assert time.time() - t0 < 5
    assert str(p) in str(info.value) and fragment in str(info.value), str(info.value)


def test_case8_non_utf8_nplm_file(tmp_path):
    p = tmp_path / "bad.nplm"
    p.write_bytes(NPLM_HEAD.format(n=3, V=4, E=2).encode() + b"\\vocab\n<unk>\n\xff\xfe\n")
    with pytest.raises(InputError, match="UTF-8"):
        read_nplm(str(p))


# -- case 10: a model file overwritten in place under a running process --------------------------

def test_case10_model_overwritten_in_place_is_detected(models, tmp_path):
    live = str(tmp_path / "live.nlm")
    shutil.copyfile(models["unnormalised"], live)
    m = nlmfeature.load(live)
    before = m.score_sentence(SENTENCES[0])
    sess = m.session()
    sess.begin_sentence(0)
    shutil.copyfile(models["other"], live)  # cp new.nlm live.nlm: same inode, new bytes
    with pytest.raises(ModelFileError) as info:
        sess.begin_sentence(1)
    assert live in str(info.value) and "renam" in str(info.value)
    # the session refuses to score from the changed mapping (no SIGBUS, no wrong score)
    assert math.isnan(sess.score(np.array([1], dtype=np.int32), 5))
    with pytest.raises(ModelFileError):
        m.score_sentence(SENTENCES[0])
    with pytest.raises(ModelFileError):
        m.score_batch(np.zeros((1, m.order - 1), dtype=np.int32), np.array([5], dtype=np.int32))
    assert before.shape[0] > 0


def test_case10_replacing_by_rename_is_safe(models, tmp_path):
    live = str(tmp_path / "live.nlm")
    shutil.copyfile(models["unnormalised"], live)
    m = nlmfeature.load(live)
    before = m.score_sentence(SENTENCES[1])
    tmp = str(tmp_path / "live.nlm.new")
    shutil.copyfile(models["other"], tmp)
    os.replace(tmp, live)  # the documented way: the running process keeps the old model
    assert not m.native.file_changed()
    assert np.array_equal(m.score_sentence(SENTENCES[1]), before)
    assert nlmfeature.load(live).checksum != m.checksum


def test_case10_persistent_cache_stores_nothing_after_a_change(models, tmp_path):
    from nlmfeature.decoder.pcache import CachedScorer
    live = str(tmp_path / "live.nlm")
    shutil.copyfile(models["unnormalised"], live)
    m = nlmfeature.load(live)
    d = tmp_path / "pc"
    cs = CachedScorer(m, directory=str(d), quiet=True)
    cs.begin(0)
    cs.score_sentence(SENTENCES[0])
    cs.end()
    files = sorted(os.listdir(cs.directory))
    with open(live, "r+b") as f:  # overwritten in place, same size
        f.seek(4096)
        f.write(b"\x7f" * 64)
    with pytest.raises(ModelFileError):
        cs.begin(1)
    assert np.all(np.isnan(cs.score_sentence(SENTENCES[1])))
    cs.end()
    assert sorted(os.listdir(cs.directory)) == files  # nothing cached under the old checksum


# -- C API: cases 1, 4, 10 through tests/c/test_capi.c ----------------------------------------------

@pytest.fixture(scope="module")
def capi(tmp_path_factory):
    from test_capi import SOURCE, _config
    from nlmfeature.commands import config as nlmconfig
    if shutil.which("cc") is None or not os.path.exists(nlmconfig.paths()["library"]):
        pytest.skip("no C compiler or libnlmfeature.so not built")
    exe = str(tmp_path_factory.mktemp("capi_boundary") / "test_capi")
    subprocess.run(["cc", "-O1", "-Wall", "-Werror", *_config("--cflags"), SOURCE, "-o", exe,
                    *_config("--libs"), "-lpthread", "-lm"], check=True)
    return exe


def _fields(stdout):
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


def test_case1_c_api_refuses_bad_vocab_hash_without_hanging(capi, models, tmp_path):
    V = len(nlmfeature.load(models["unnormalised"]).vocab)
    for case, edit in _hash_cases(V).items():
        path = _mutated(tmp_path, models["unnormalised"], f"{case}.nlm", arrays={"vocab.hash": _int32(edit)})
        p = subprocess.run([capi, "load", path], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "status=-2" in p.stdout, (case, p.stdout, p.stderr)
        assert path in p.stdout and "vocab.hash" in p.stdout


@pytest.mark.parametrize("kind", ["unnormalised", "class"])
def test_case4_c_api_contracts(capi, models, kind):
    p = subprocess.run([capi, "contracts", models[kind]], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    f = _fields(p.stdout)
    assert f["done"] == "1"
    num = {k: float(v) for k, v in f.items() if k[0] in "psa" and not k.endswith("message")}
    # out-of-range ids are scored as <unk> by every entry
    assert num["padded_bad"] == num["padded_unk"] == num["padded_bad_min"]
    assert math.isfinite(num["padded_bad"])
    assert num["score_bad"] == num["score_unk"]
    assert math.isfinite(num["sequence_bad"]) and math.isfinite(num["partial_bad"])
    m = nlmfeature.load(models[kind])
    unk = m.vocab.unk
    assert num["padded_unk"] == pytest.approx(m.score_ngram([m.vocab.words[unk]] * (m.order - 1), "<unk>"), abs=1e-6)
    # null pointers and calls out of order: NaN / error codes, no crash
    # span positions outside the history are refused (NaN and a message), not clamped
    assert f["span_bad"] == "nan" and f["joint_span_bad"] == "nan"
    for k in ("null_session", "null_context", "null_padded_session", "null_partial", "null_sequence_words",
              "null_joint_span_session", "null_joint_span_hist", "null_joint_span_aff"):
        assert f[k] == "nan", (k, f[k])
    assert "NULL session" in f["null_session_message"]
    assert int(f["end_before_begin"]) == -6 and int(f["end_twice"]) == -6
    assert int(f["null_begin"]) == -1 and int(f["null_stats"]) == -1 and int(f["null_load"]) == -1
    assert f["null_session_new"] == "1" and f["null_vocab_word"] == "1" and f["null_word_id"] == "0"
    assert num["after_model_free"] == num["padded_unk"]


def test_case10_c_api_reports_a_model_overwritten_in_place(capi, models, tmp_path):
    live = str(tmp_path / "live.nlm")
    shutil.copyfile(models["unnormalised"], live)
    p = subprocess.Popen([capi, "replace", live], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("ready ")
    shutil.copyfile(models["other"], live)  # smaller: pages past its end would raise SIGBUS
    assert os.path.getsize(live) < os.path.getsize(models["unnormalised"])
    out, err = p.communicate("go\n", timeout=60)
    assert p.returncode == 0, f"died with {p.returncode}: {err}"
    f = dict(kv.split("=", 1) for kv in out.strip().split(" ", 2))
    assert int(f["begin"]) == -2 and f["score"] == "nan"
    assert live in f["message"] and "renam" in f["message"]
