"""The k-best pool: merging, de-duplication, persistence, and bad input."""
from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

from nlmfeature.mt.bleu import References
from nlmfeature.errors import InputError
from nlmfeature.mt.kbest import format_hypothesis, read_kbest
from nlmfeature.mt.tuning.data import KbestPool
from nlmfeature.mt.weights import read_weights

DATA = os.path.join(os.path.dirname(__file__), "data", "tuning")
IT1 = os.path.join(DATA, "multi30k.dev.iter1.200x30.kbest.gz")
IT2 = os.path.join(DATA, "multi30k.dev.iter2.200x30.kbest.gz")
REF = os.path.join(DATA, "multi30k.dev.ref.200.en")
INI1 = os.path.join(DATA, "multi30k.dev.iter1.moses.ini")
REG1 = os.path.join(DATA, "regtest.nbest.1.gz")
REG_REF = os.path.join(DATA, "regtest.reference")
SCORER = os.path.join(DATA, "scorer.nbest.20.gz")
SCORER_REF = os.path.join(DATA, "scorer.reference.20")


@pytest.fixture(scope="module")
def refs():
    return References.from_files([REF])


def kbest_lines(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def test_pool_merges_iterations_and_drops_duplicates(refs):
    pool = KbestPool(refs)
    read1, new1 = pool.add_file(IT1)
    assert read1 == len(kbest_lines(IT1))
    assert pool.labels == [("LexicalReordering0", 6), ("Distortion0", 1), ("LM0", 1),
                           ("WordPenalty0", 1), ("PhrasePenalty0", 1), ("TranslationModel0", 4)]
    assert pool.dim == 14
    read_again, new_again = pool.add_file(IT1)        # the same list again adds nothing
    assert (read_again, new_again) == (read1, 0)
    read2, new2 = pool.add_file(IT2)
    assert 0 < new2 <= read2
    A = pool.arrays()
    assert A.features.shape == (new1 + new2, 14)
    assert A.offsets[-1] == new1 + new2 and A.num_sentences == 200
    # no two rows of one sentence have equal features and statistics
    for s in range(0, 200, 17):
        rows = {(A.features[r].tobytes(), A.stats[r].tobytes())
                for r in range(A.offsets[s], A.offsets[s + 1])}
        assert len(rows) == A.offsets[s + 1] - A.offsets[s]
    # rows hold the file's numbers and sacrebleu-style statistics of the text
    first = next(iter(read_kbest(IT1)))
    assert A.features[0].tolist() == first.dense()
    assert pool.text(0) == first.text
    assert A.stats[0].tolist() == refs.stats(0, first.text).tolist()


def test_pool_save_and_load_round_trip(refs, tmp_path):
    pool = KbestPool(refs)
    pool.add_file(IT1)
    path = str(tmp_path / "pool.npz")
    pool.save(path)
    back = KbestPool.load(path, refs)
    a, b = pool.arrays(), back.arrays()
    assert np.array_equal(a.features, b.features)
    assert np.array_equal(a.stats, b.stats)
    assert np.array_equal(a.offsets, b.offsets)
    assert back.labels == pool.labels and back.sources == pool.sources
    assert back.texts(range(0, 50)) == pool.texts(range(0, 50))
    assert back.add_file(IT1)[1] == 0                 # de-duplication survives the round trip
    # a pool refuses other references
    other = References.from_files([REF], lowercase=True)
    with pytest.raises(InputError) as exc:
        KbestPool.load(path, other)
    assert "other references" in str(exc.value)
    # the file is a plain npz: no pickle needed
    with np.load(path, allow_pickle=False) as z:
        assert "features" in z.files


def test_weights_map_to_columns_and_back(refs):
    pool = KbestPool(refs)
    pool.add_file(IT1)
    w = read_weights(INI1)
    vec = pool.weight_vector(w, INI1)
    assert vec.tolist() == [0.3] * 6 + [0.3, 0.5, -1.0, 0.2] + [0.2] * 4
    back = pool.weights_dict(vec * 2, w)
    assert list(back) == list(w)                       # order of the original file kept
    assert back["UnknownWordPenalty0"] == [1.0]        # untuned feature untouched
    assert back["LM0"] == [1.0]
    with pytest.raises(InputError) as exc:
        pool.weight_vector({"LM0": [1.0]}, "w.txt")
    assert "w.txt" in str(exc.value) and "TranslationModel0" in str(exc.value)


def test_old_style_moses_and_cdec_lists(tmp_path):
    refs = References.from_files([SCORER_REF])
    pool = KbestPool(refs)
    pool.add_file(SCORER)
    assert pool.labels == [("d", 7), ("lm", 2), ("tm", 5), ("w", 1)]
    # the same hypotheses as a cdec list (one value per name, zero features left out)
    cdec = tmp_path / "cdec.kbest"
    with open(cdec, "w", encoding="utf-8") as f:
        for h in read_kbest(SCORER):
            h.features = [(f"{l}_{i}", [v]) for l, vals in h.features
                          for i, v in enumerate(vals) if v != 0.0]
            f.write(format_hypothesis(h, "cdec") + "\n")
    cpool = KbestPool(refs)
    cpool.add_file(str(cdec))
    a, b = pool.arrays(), cpool.arrays()
    assert np.array_equal(a.stats, b.stats)
    names = cpool.feature_names()
    cols = [names.index(f"{l}_{i}") if f"{l}_{i}" in names else -1
            for l, k in pool.labels for i in range(k)]
    for j, c in enumerate(cols):
        if c < 0:
            assert np.all(a.features[:, j] == 0)       # a feature that is always zero
        else:
            assert np.array_equal(a.features[:, j], b.features[:, c])


# -- bad input --------------------------------------------------------------------------------
def write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
    return str(p)


def test_empty_kbest_list(tmp_path):
    refs = References.from_files([REG_REF])
    path = write(tmp_path, "empty.kbest", [])
    with pytest.raises(InputError) as exc:
        KbestPool(refs).add_file(path)
    assert "empty.kbest" in str(exc.value) and "empty" in str(exc.value)


def test_mismatched_reference_count(tmp_path):
    lines = kbest_lines(REG1)
    short = write(tmp_path, "ref9.txt", open(REG_REF, encoding="utf-8").read().splitlines()[:9])
    with pytest.raises(InputError) as exc:
        KbestPool(References.from_files([short])).add_file(REG1)
    msg = str(exc.value)
    assert "regtest.nbest.1.gz:" in msg and "sentence id 9" in msg and "9 lines" in msg
    # a list that covers only part of the references
    part = write(tmp_path, "part.kbest", [l for l in lines if int(l.split("|||")[0]) < 7])
    with pytest.raises(InputError) as exc:
        KbestPool(References.from_files([REG_REF])).add_file(part)
    assert "part.kbest" in str(exc.value) and "covers 7 of the 10" in str(exc.value)


def test_non_numeric_feature_names_the_line(tmp_path):
    lines = kbest_lines(REG1)
    lines[41] = lines[41].replace("lm= ", "lm= abc ", 1)
    path = write(tmp_path, "bad.kbest", lines)
    with pytest.raises(InputError) as exc:
        KbestPool(References.from_files([REG_REF])).add_file(path)
    assert "bad.kbest:42" in str(exc.value) and "'abc'" in str(exc.value)


def test_line_with_too_few_fields_names_the_line(tmp_path):
    lines = kbest_lines(REG1)
    lines[5] = "0 ||| only a hypothesis"
    path = write(tmp_path, "short.kbest", lines)
    refs = References.from_files([REG_REF])
    with pytest.raises(InputError) as exc:
        KbestPool(refs).add_file(path)
    assert "short.kbest:6" in str(exc.value) and "3" in str(exc.value)
    # --skip-bad skips it
    pool = KbestPool(refs)
    read, _ = pool.add_file(path, skip_bad=True)
    assert read == len(lines) - 1


def test_feature_count_changing_between_lines(tmp_path):
    lines = kbest_lines(REG1)
    lines[10] = lines[10].replace("lm= ", "lm= -1.5 ", 1)    # lm gets two values here
    path = write(tmp_path, "count.kbest", lines)
    with pytest.raises(InputError) as exc:
        KbestPool(References.from_files([REG_REF])).add_file(path)
    assert "count.kbest:11" in str(exc.value) and "'lm'" in str(exc.value)


def test_out_of_order_sentence_ids(tmp_path):
    lines = kbest_lines(REG1)
    moved = lines[:150] + lines[250:] + lines[150:250]      # sentence 1 split in two runs
    path = write(tmp_path, "order.kbest", moved)
    with pytest.raises(InputError) as exc:
        KbestPool(References.from_files([REG_REF])).add_file(path)
    assert "order.kbest:901" in str(exc.value) and "reappears" in str(exc.value)


def test_parallel_reading_equals_sequential(refs):
    one = KbestPool(refs)
    one.add_file(IT1)
    one.add_file(IT2)
    two = KbestPool(refs)
    results = two.add_files([IT1, IT2], jobs=2)
    a, b = one.arrays(), two.arrays()
    assert np.array_equal(a.features, b.features) and np.array_equal(a.stats, b.stats)
    assert np.array_equal(a.offsets, b.offsets) and one.sources == two.sources
    assert results[1][1] == b.offsets[-1] - results[0][1]
    assert two.texts(range(0, len(b.features), 97)) == one.texts(range(0, len(a.features), 97))


def test_parallel_merge_maps_columns_of_other_layouts(tmp_path):
    refs = References.from_files([SCORER_REF])
    paths = []
    for name, flip in (("a", False), ("b", True)):
        path = tmp_path / f"{name}.kbest"
        with open(path, "w", encoding="utf-8") as f:
            for h in read_kbest(SCORER):
                feats = [(f"{l}_{i}", [v]) for l, vals in h.features
                         for i, v in enumerate(vals) if v != 0.0]
                if flip:                        # other order, other values: a new list
                    feats = [(l, [v[0] * 1.5]) for l, v in reversed(feats)]
                    h.text = h.text + " ."
                h.features = feats
                f.write(format_hypothesis(h, "cdec") + "\n")
        paths.append(str(path))
    seq = KbestPool(refs)
    for p in paths:
        seq.add_file(p)
    par = KbestPool(refs)
    par.add_files(paths, jobs=2)
    assert seq.labels == par.labels
    a, b = seq.arrays(), par.arrays()
    assert np.array_equal(a.features, b.features) and np.array_equal(a.stats, b.stats)
