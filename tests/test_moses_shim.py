"""The Moses shim (moses_ff/), built into the Moses tree at $MOSES_ROOT and decoding real
fr->en sentences with a real phrase table: every n-best entry's NLM feature value equals the
Python scorer's sentence log-probability of its output string.

Skipped unless MOSES_ROOT points at a built mosesdecoder tree.  The test copies
moses_ff/NLMFeature.{h,cpp} into $MOSES_ROOT/moses/LM, applies moses_ff/moses.patch if it is
not applied yet, and runs bjam with --with-nlmfeature (incremental: seconds when up to date).
MOSES_BJAM_ARGS gives the bjam options the tree was built with, else the tree's own
.bjam-args (written by ../shared/tools/build-decoders.sh), else helpers.DEFAULT_BJAM_ARGS; they
must match the original build or bjam rebuilds everything (and a tree built --with-nplm fails
to link without it).
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import nlmfeature

from helpers import (build_moses_with_shim, check_nbest, decode_while_model_changes, phrase_table_models,
                     stats_totals, write_ini)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA = os.path.join(HERE, "data", "decoder")
MOSES_ROOT = os.environ.get("MOSES_ROOT")

pytestmark = pytest.mark.skipif(
    not MOSES_ROOT or not os.path.exists(os.path.join(MOSES_ROOT or "/", "moses", "LM", "Jamfile")),
    reason="set MOSES_ROOT to a built mosesdecoder tree to test the Moses shim")
pytestmark = [pytest.mark.decoder, pytestmark]   # -m decoder / -m "not decoder"; counted in the summary


@pytest.fixture(scope="module")
def moses() -> str:
    """The moses binary of $MOSES_ROOT with NLMFeature compiled in."""
    return build_moses_with_shim(MOSES_ROOT)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Random-weight order-5 models over the target side of the phrase table."""
    return phrase_table_models(tmp_path_factory.mktemp("moses_models"))


def decode(moses, ini, tmp_path, *extra, nbest=20, tag="run"):
    nb = str(tmp_path / f"{tag}.nbest")
    p = subprocess.run([moses, "-f", ini, "-i", os.path.join(DATA, "fr.txt"), "-n-best-list", nb, str(nbest),
                        *extra], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    entries = []
    with open(nb, encoding="utf-8") as f:
        for line in f:
            sid, words, feats, total = line.rstrip("\n").split(" ||| ")
            entries.append((int(sid), words.strip(), feats))
    return p.stdout.splitlines(), entries, p.stderr


@pytest.mark.parametrize("kind", ["unnormalised", "class", "large"])
def test_nbest_feature_equals_python_sentence_score(moses, models, tmp_path, kind):
    ini = write_ini(tmp_path / "nlm.ini", f"NLMFeature name=NLM0 path={models[kind]} factor=0")
    out, entries, _ = decode(moses, ini, tmp_path)
    assert len(out) == 10 and all(out)
    assert len({sid for sid, _, _ in entries}) == 10
    check_nbest(entries, models[kind])


def test_decodes_with_and_without_the_feature_and_threads(moses, models, tmp_path):
    base_out, base_entries, _ = decode(moses, write_ini(tmp_path / "base.ini"), tmp_path, tag="base")
    assert len(base_out) == 10 and all("NLM0" not in f for _, _, f in base_entries)
    ini = write_ini(tmp_path / "nlm.ini", f"NLMFeature name=NLM0 path={models['unnormalised']} order=5 factor=0",
                    weight=1.0)
    one, e1, _ = decode(moses, ini, tmp_path, tag="t1")
    two, e2, _ = decode(moses, ini, tmp_path, "-threads", "2", tag="t2")
    assert one == two  # per-thread sessions give the same translations
    assert sorted(e1) == sorted(e2)
    check_nbest(e2, models["unnormalised"])
    assert one != base_out  # a heavy weight on a random model changes the search


@pytest.mark.parametrize("kind", ["unnormalised", "class"])
def test_prefetch_companion_changes_no_score(moses, models, tmp_path, kind):
    """NLMFeature registers a stateless companion (NLM0-prefetch) that starts each expansion's
    lookups before Moses' stateful features run (nlm_prefetch_span); with it (the default) and
    without it (prefetch=false), on 1 and 2 threads, the n-best lists and their scores are the
    same, and it adds no score or weight of its own."""
    on = write_ini(tmp_path / "on.ini", f"NLMFeature name=NLM0 path={models[kind]} factor=0", weight=1.0)
    off = write_ini(tmp_path / "off.ini", f"NLMFeature name=NLM0 path={models[kind]} factor=0 prefetch=false",
                    weight=1.0)
    out_on, e_on, _ = decode(moses, on, tmp_path, tag="on")
    out_off, e_off, _ = decode(moses, off, tmp_path, tag="off")
    out_two, e_two, _ = decode(moses, on, tmp_path, "-threads", "2", tag="two")
    assert out_on == out_off == out_two
    assert e_on == e_off and sorted(e_on) == sorted(e_two)
    assert all("prefetch" not in f for _, _, f in e_on)
    check_nbest(e_on, models[kind])
    # made when the feature loads: -show-weights (which tuning scripts read) does not list it
    shown = subprocess.run([moses, "-f", on, "-show-weights"], capture_output=True, text=True, timeout=600)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "NLM0=" in shown.stdout and "prefetch" not in shown.stdout


def test_persistent_cache_second_run(moses, models, tmp_path):
    d = tmp_path / "pc"
    ini = write_ini(tmp_path / "nlm.ini", f"NLMFeature name=NLM0 path={models['class']} factor=0 "
                                          f"persistent-cache={d} stats=true")
    first, e1, err1 = decode(moses, ini, tmp_path, tag="p1")
    second, e2, err2 = decode(moses, ini, tmp_path, "-threads", "2", tag="p2")
    assert first == second and sorted(e1) == sorted(e2)


    t1, t2 = stats_totals(err1, "NLMFeature NLM0 sentence"), stats_totals(err2, "NLMFeature NLM0 sentence")
    assert t1["persistent_hits"] == 0 and t1["persistent_written"] > 0
    assert t2["persistent_loaded"] > 0 and t2["persistent_hits"] == t2["lookups"]
    m = nlmfeature.load(models["class"])
    assert len(os.listdir(d / m.checksum)) >= 10


def test_bad_model_path_is_a_clean_error(moses, tmp_path):
    ini = write_ini(tmp_path / "bad.ini", f"NLMFeature name=NLM0 path={tmp_path}/missing.nlm")
    p = subprocess.run([moses, "-f", ini, "-i", os.path.join(DATA, "fr.txt")], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0
    assert "missing.nlm: cannot open model file" in p.stderr
    assert "Segmentation" not in p.stderr and p.returncode > 0


def test_model_overwritten_in_place_stops_moses_with_the_reason(moses, models, tmp_path):
    # `cp new.nlm live.nlm` under a running decoder: the next sentence start notices the file
    # changed (size / mtime of the mapped file) and Moses stops with exit status 2 and a
    # message naming the file, instead of SIGBUS or NaN scores
    live = str(tmp_path / "live.nlm")
    shutil.copyfile(models["unnormalised"], live)
    ini = write_ini(tmp_path / "live.ini", f"NLMFeature name=NLM0 path={live} stats=true")
    sentences = open(os.path.join(DATA, "fr.txt"), encoding="utf-8").read().splitlines()
    # Moses ends a sentence's features after printing it: overwrite once the stats line of
    # sentence 0 (printed after its end) is out, so the change falls between sentences
    status, out, err = decode_while_model_changes([moses, "-f", ini], sentences, live, models["class"],
                                                  ended="NLM0 sentence 0 lookups=")
    assert status == 2, err[-2000:]
    assert len(out) == 1
    assert f"{live}: the model file was changed in place" in err
