"""The Moses joint-model feature (moses_ff/NLMJointFeature.*) built into the Moses tree at
$MOSES_ROOT, decoding real Multi30k German sentences with a slice of the real phrase table
(whose phrases carry word alignments): every n-best entry's NNJM0 value equals the Python
joint scorer's log-probability of its output, with each word affiliated inside its phrase
(from the n-best segmentation and alignment fields), and </s> with the source </s>.

Skipped unless MOSES_ROOT points at a built mosesdecoder tree.  Like tests/test_moses_shim.py
it copies moses_ff/NLMFeature.* and NLMJointFeature.* into $MOSES_ROOT/moses/LM, applies
moses_ff/moses.patch and moses_ff/moses-joint.patch if needed and runs bjam (MOSES_BJAM_ARGS).
"""
from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest

import nlmfeature
from nlmfeature.core.architecture import ModelSpec, random_model
from nlmfeature.core.joint import affiliations, joint_ngrams
from nlmfeature.core.vocab import Vocabulary, count_words

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data", "decoder", "multi30k")
from helpers import build_moses_with_shim, joint_slice_model  # noqa: E402
from test_moses_shim import MOSES_ROOT, pytestmark  # noqa: F401


@pytest.fixture(scope="module")
def moses() -> str:
    """The moses binary of $MOSES_ROOT with NLMFeature and NLMJointFeature compiled in."""
    return build_moses_with_shim(MOSES_ROOT, joint=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A random-weight joint model over the two sides of the phrase-table slice."""
    return joint_slice_model(str(tmp_path_factory.mktemp("moses_joint") / "joint.nlm"))


def write_ini(path, feature_line=None, weight=0.5):
    lines = ["[input-factors]", "0", "[mapping]", "0 T 0", "[distortion-limit]", "6", "[feature]",
             "UnknownWordPenalty", "WordPenalty", "PhrasePenalty",
             f"PhraseDictionaryMemory name=TranslationModel0 num-features=4 path={DATA}/phrase-table.gz "
             "input-factor=0 output-factor=0 table-limit=20",
             "LexicalReordering name=LexicalReordering0 num-features=6 type=wbe-msd-bidirectional-fe-allff "
             f"input-factor=0 output-factor=0 path={DATA}/reordering-table.wbe-msd-bidirectional-fe.gz",
             "Distortion"]
    if feature_line:
        lines.append(feature_line)
    lines += ["[weight]", "LexicalReordering0= 0.03 0.14 0.13 0.03 -0.03 0.03", "Distortion0= 0.014",
              "WordPenalty0= -0.15", "PhrasePenalty0= 0.05", "TranslationModel0= 0.07 0.05 0.1 0.05",
              "UnknownWordPenalty0= 1"]
    if feature_line:
        lines.append(f"NNJM0= {weight}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def decode(moses, ini, tmp_path, *extra, tag="run"):
    nb = str(tmp_path / f"{tag}.nbest")
    p = subprocess.run([moses, "-f", ini, "-i", os.path.join(DATA, "de.txt"), "-n-best-list", nb, "20",
                        "-include-segmentation-in-n-best", "true", "-print-alignment-info-in-n-best", "true",
                        *extra], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    entries = []
    with open(nb, encoding="utf-8") as f:
        for line in f:
            fields = [x.strip() for x in line.rstrip("\n").split("|||")]
            entries.append((int(fields[0]), fields[1], fields[2], fields[4], fields[5]))
    return p.stdout.splitlines(), entries, p.stderr


def decoder_affiliations(n_src, words, segmentation, alignment):
    """Affiliations as the feature computes them: Devlin et al. 2014 inside each phrase."""
    pts = [tuple(map(int, p.split("-"))) for p in alignment.split()]
    aff = np.full(len(words) + 1, -1, dtype=np.int32)
    aff[-1] = n_src
    for seg in segmentation.split():
        s, t = seg.split("=")
        s0, s1 = (list(map(int, s.split("-"))) * 2)[:2]
        t0, t1 = (list(map(int, t.split("-"))) * 2)[:2]
        local = [(i - s0, j - t0) for i, j in pts if t0 <= j <= t1 and s0 <= i <= s1]
        aff[t0:t1 + 1] = affiliations(s1 - s0 + 1, t1 - t0 + 1, local)[:-1] + s0
    assert (aff >= 0).all(), (segmentation, alignment)
    return aff


def check_nbest(entries, model_path):
    jm = nlmfeature.load(model_path)
    sources = [l.split() for l in open(os.path.join(DATA, "de.txt"), encoding="utf-8")]
    assert entries
    for sid, text, feats, seg, al in entries:
        v = float(re.search(r"NNJM0= (\S+)", feats).group(1))
        words = text.split()
        aff = decoder_affiliations(len(sources[sid]), words, seg, al)
        d = joint_ngrams([sources[sid]], [words], [aff], jm.vocab, jm.source_vocab, jm.order, jm.window)
        want = float(jm.score_batch(d.contexts, d.words).sum())
        assert abs(v - want) <= 1e-3 + 1e-5 * abs(want), (sid, text, v, want)


def test_nbest_feature_equals_python_joint_score(moses, model, tmp_path):
    ini = write_ini(tmp_path / "nnjm.ini", f"NLMJointFeature name=NNJM0 path={model}")
    out, entries, _ = decode(moses, ini, tmp_path)
    assert len(out) == 5 and all(out)
    check_nbest(entries, model)
    base, _, _ = decode(moses, write_ini(tmp_path / "base.ini"), tmp_path, tag="base")
    heavy, e2, _ = decode(moses, write_ini(tmp_path / "heavy.ini", f"NLMJointFeature name=NNJM0 path={model}",
                                            weight=2.0), tmp_path, "-threads", "2", tag="heavy")
    assert heavy != base          # a heavy weight on a random model changes the search
    check_nbest(e2, model)        # per-thread sessions, same exact values


def test_target_only_model_is_a_clean_error(moses, tmp_path):
    lm = tmp_path / "lm.nlm"
    vocab = Vocabulary.from_counts(count_words(["a man"]), min_count=1)
    h, a = random_model(ModelSpec(order=3, word_width=8), vocab)
    nlmfeature.save(str(lm), h, a)
    ini = write_ini(tmp_path / "bad.ini", f"NLMJointFeature name=NNJM0 path={lm}")
    p = subprocess.run([moses, "-f", ini, "-i", os.path.join(DATA, "de.txt")], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0 and "is a target-only model" in p.stderr


def test_persistent_cache_second_run_is_identical(moses, model, tmp_path):
    # the cache keys hold the source window: a second run reads every n-gram score from the
    # files the first one wrote and decodes exactly the same n-best list
    cache = tmp_path / "pcache"
    ini = write_ini(tmp_path / "pc.ini", f"NLMJointFeature name=NNJM0 path={model} persistent-cache={cache} "
                                         "stats=true")
    env = dict(os.environ, NLMFEATURE_PERSISTENT_CACHE="always")
    runs = []
    for tag in ("first", "second"):
        nb = str(tmp_path / f"{tag}.nbest")
        p = subprocess.run([moses, "-f", ini, "-i", os.path.join(DATA, "de.txt"), "-n-best-list", nb, "20"],
                           capture_output=True, text=True, timeout=900, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append((p.stdout, open(nb, encoding="utf-8").read(), p.stderr))
    assert runs[0][:2] == runs[1][:2]
    hits = [sum(int(h) for h in re.findall(r"persistent_hits=(\d+)", r[2])) for r in runs]
    assert hits[0] == 0 and hits[1] > 0, hits
    _, plain, _ = decode(moses, write_ini(tmp_path / "plain.ini", f"NLMJointFeature name=NNJM0 path={model}"),
                         tmp_path, tag="plain")
    assert len(runs[1][1].splitlines()) == len(plain)


def test_unnormalised_joint_model_goes_without_the_ngram_cache_by_default(moses, tmp_path):
    # beside NLMFeature an unnormalised joint model's n-gram table crowds the other's out of the
    # CPU caches (Moses, KenLM + NLM + joint 4-6% faster without it): NLMJointFeature leaves
    # it off unless ngram-cache-entries is on the line; the same n-best lists either way
    spec = ModelSpec(arch="lbl", order=4, word_width=64, diagonal_contexts=True, output="unnormalised",
                     source_window=5)
    path = joint_slice_model(str(tmp_path / "lbl-joint.nlm"), spec)
    runs = {}
    for tag, extra in (("default", ""), ("asked", " ngram-cache-entries=65536")):
        ini = write_ini(tmp_path / f"{tag}.ini", f"NLMJointFeature name=NNJM0 path={path} stats=true{extra}")
        out, nbest, err = decode(moses, ini, tmp_path, tag=tag)
        hits = sum(int(h) for h in re.findall(r"NNJM0 sentence \d+ .*?ngram_hits=(\d+)", err))
        runs[tag] = (out, nbest, hits)
    assert runs["default"][:2] == runs["asked"][:2]
    assert runs["default"][2] == 0 and runs["asked"][2] > 0, (runs["default"][2], runs["asked"][2])
    check_nbest(runs["default"][1], path)
