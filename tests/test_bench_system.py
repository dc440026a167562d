"""``nlmfeature bench system tatoeba``: the data steps on a slice of the real Tatoeba export
(skipped without the fetched mirror), the held-out rule, the seeded split and
``clean-corpus-n.perl``'s rule; the whole build on 300 pairs with a real Moses tree
(``MOSES_ROOT``) and fast_align (built from its mirror, or ``$FAST_ALIGN``: a build folder)."""
from __future__ import annotations

import gzip
import json
import os

import pytest

from nlmfeature.bench import shared_data
from nlmfeature.bench import memory as bench_memory
from nlmfeature.bench import systems
from nlmfeature.cli import main as cli_main
from nlmfeature.errors import InputError, NLMFeatureError

MIRRORS = systems.default_mirrors()
HELDOUT = shared_data("heldout", "tatoeba.sha256")
ROOT = os.environ.get("MOSES_ROOT", "/nonexistent")


def _has_mirror(repo: str) -> bool:
    try:
        systems.mirror_dir(MIRRORS, repo)
        return True
    except InputError:
        return False


needs_tatoeba = pytest.mark.skipif(not _has_mirror(systems.TATOEBA[0]) or not os.path.isfile(HELDOUT),
                                   reason="needs the github:rioyshky/translation mirror "
                                          "(NLMFEATURE_MIRRORS) and the shared held-out list")


@pytest.fixture(scope="module")
def tatoeba():
    return systems.read_tatoeba(systems.mirror_file(MIRRORS, *systems.TATOEBA))


@needs_tatoeba
def test_the_export_and_the_held_out_rule(tatoeba):
    """The whole export: 169,813 pairs, 168,269 once the listed sentences are dropped (as the
    list's README says), no listed side left, and no exact duplicate pair."""
    assert len(tatoeba) == 169813
    assert tatoeba[2] == ("Lauf!", "Run!")                 # (German, English)
    keys = systems.read_heldout(HELDOUT)
    kept = systems.drop_heldout(tatoeba, keys)
    assert len(kept) == 168269
    assert not any(systems.sentence_key(s) in keys for p in kept for s in p)
    kept_set = set(kept)
    dropped = [p for p in tatoeba if p not in kept_set]
    assert len(dropped) == len(tatoeba) - len(kept)
    assert all(systems.sentence_key(p[0]) in keys or systems.sentence_key(p[1]) in keys
               for p in dropped)
    assert len(systems.dedupe(kept)) == len(kept)


@needs_tatoeba
def test_a_listed_pair_is_dropped_by_either_side(tatoeba):
    pairs = tatoeba[:200]
    de_key = systems.sentence_key(pairs[10][0])
    # the key ignores white space differences, not case
    en_key = systems.sentence_key("  " + pairs[20][1].replace(" ", "  ") + " ")
    kept = systems.drop_heldout(pairs, {de_key, en_key})
    assert pairs[10] not in kept and pairs[20] not in kept
    # other pairs that share the dropped sides go too; everything else stays
    assert all(p[0] != pairs[10][0] and p[1] != pairs[20][1] for p in kept)
    assert len(kept) == sum(p[0] != pairs[10][0] and p[1] != pairs[20][1] for p in pairs)
    assert systems.drop_heldout(pairs, {systems.sentence_key(pairs[10][0].upper())}) == pairs


@needs_tatoeba
def test_the_split_is_seeded_and_disjoint(tatoeba):
    pairs = systems.dedupe(tatoeba[:200])
    a = systems.split(pairs, 20, 30, seed=1)
    assert {k: len(v) for k, v in a.items()} == {"dev": 20, "test": 30, "train": len(pairs) - 50}
    assert a == systems.split(pairs, 20, 30, seed=1)
    b = systems.split(pairs, 20, 30, seed=2)
    assert a["dev"] != b["dev"]
    sets = [set(v) for v in a.values()]
    assert sum(map(len, sets)) == len(pairs) and set().union(*sets) == set(pairs)
    # the order of the export is kept inside each set
    assert a["train"] == [p for p in pairs if p in sets[2]]
    with pytest.raises(NLMFeatureError, match="cannot split"):
        systems.split(pairs, 100, len(pairs) - 100, seed=1)


def test_dedupe_keeps_the_first_of_exact_repeats():
    pairs = [("a", "x"), ("b", "y"), ("a", "x"), ("a", "z"), ("b", "y")]
    assert systems.dedupe(pairs) == [("a", "x"), ("b", "y"), ("a", "z")]


def test_clean_pair_is_clean_corpus_n():
    assert systems.clean_pair(" a  b ", "c") == ("a b", "c")
    assert systems.clean_pair("a | b", "c") == ("a b", "c")      # | removed as the Perl script
    assert systems.clean_pair("", "c") is None
    assert systems.clean_pair("|", "c") is None
    assert systems.clean_pair(" ".join(["w"] * 80), " ".join(["w"] * 9)) is not None
    assert systems.clean_pair(" ".join(["w"] * 81), " ".join(["w"] * 10)) is None
    assert systems.clean_pair(" ".join(["w"] * 10), "w") is None   # ratio 10 > 9
    assert systems.clean_pair(" ".join(["w"] * 9), "w") is not None


def test_untuned_ini_names_model_dir(tmp_path):
    for name in ("phrase-table.gz", "lm.en.5g.arpa.gz"):
        (tmp_path / name).write_text("")
    lines = ["[feature]", "PhraseDictionaryMemory name=TranslationModel0 path=/x/model/phrase-table.gz "
             "input-factor=0", "KENLM name=LM0 factor=0 path=/y/lm.en.5g.arpa.gz order=5", "# path=/z"]
    out = systems.untuned_ini(lines, str(tmp_path))
    assert out[1].endswith("path=MODEL_DIR/phrase-table.gz input-factor=0")
    assert "path=MODEL_DIR/lm.en.5g.arpa.gz order=5" in out[2] and out[3] == "# path=/z"
    with pytest.raises(NLMFeatureError, match="reordering"):
        systems.untuned_ini(["X path=/m/reordering-table.gz"], str(tmp_path))


def test_missing_mirror_is_named(tmp_path):
    with pytest.raises(InputError, match="rioyshky\\+translation"):
        systems.mirror_file(str(tmp_path), *systems.TATOEBA)
    with pytest.raises(InputError, match="held-out"):
        systems.read_heldout(str(tmp_path / "none.sha256"))
    with pytest.raises(NLMFeatureError, match="--moses-root"):
        systems.find_moses_root(type("A", (), {"moses_root": None})())


@needs_tatoeba
def test_data_and_prepare_steps_on_300_pairs(tmp_path, capsys):
    out = tmp_path / "sys"
    argv = ["bench", "system", "tatoeba", "-o", str(out), "--mirrors", MIRRORS, "--heldout", HELDOUT,
            "--limit", "300", "--dev-size", "20", "--test-size", "30", "--no-newstest",
            "--steps", "data,prepare"]
    assert cli_main(argv) == 0
    counts = json.loads((out / "data" / "counts.json").read_text())
    assert counts["pairs"] == 300 and counts["sets"]["dev"] == 20 and counts["sets"]["test"] == 30
    n_train = counts["sets"]["train"]
    assert n_train == counts["after_dedupe"] - 50
    dev_de = (out / "data" / "dev.de").read_text(encoding="utf-8").splitlines()
    train_de = gzip.open(out / "data" / "train.de.gz", "rt", encoding="utf-8").read().splitlines()
    assert len(dev_de) == 20 and len(train_de) == n_train
    tok = gzip.open(out / "train.tok.lc.en.gz", "rt", encoding="utf-8").read().splitlines()
    assert len(tok) == n_train and tok == [t.lower() for t in tok]
    assert (out / "sets" / "dev.tok.lc.de").read_text(encoding="utf-8").count("\n") == 20
    # a rerun skips both steps and leaves the files as they were
    before = (out / "train.tok.lc.en.gz").stat().st_mtime_ns
    assert cli_main(argv) == 0
    assert (out / "train.tok.lc.en.gz").stat().st_mtime_ns == before
    assert "data: done" in capsys.readouterr().err


def test_unknown_step_and_big_lm_without_text(tmp_path):
    with pytest.raises(NLMFeatureError, match="unknown step"):
        systems.run(_args(tmp_path, steps="data,nonsense"))
    with pytest.raises(NLMFeatureError, match="--big-lm-text"):
        systems.run(_args(tmp_path, steps="big-lm"))


def test_big_lm_step_writes_the_big_and_the_two_lm_systems(tmp_path):
    """The step 'big-lm' on a system whose big LM exists already: OUT/big loads the big LM,
    OUT/big-small both (LM0 the big one, LM1 the in-domain one, the same weight), both share
    the tables by relative links, and the earlier run's figures in build.json stay."""
    out = tmp_path / "s"
    big = out / "big"
    big.mkdir(parents=True)
    untuned = ["[feature]", "WordPenalty",
               "PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=MODEL_DIR/phrase-table.gz",
               "KENLM name=LM0 factor=0 path=MODEL_DIR/lm.en.5g.arpa.gz order=5", "",
               "[weight]", "WordPenalty0= -1", "TranslationModel0= 0.2 0.2 0.2 0.2", "LM0= 0.5"]
    (out / "moses.untuned.ini").write_text("\n".join(untuned) + "\n")
    for name in ("phrase-table.gz", "lm.en.5g.arpa.gz", "train.tok.lc.en.gz"):
        (out / name).write_bytes(b"x")
    (big / systems.BIG_LM_ARPA).write_text("\\data\\\nngram 1=3\nngram 2=2\n\n\\1-grams:\n")
    (big / systems.BIG_LM_BIN).write_bytes(b"mmap lm")
    (out / "build.json").write_text(json.dumps({"big-lm": {"lmplz_seconds": 161, "seconds": 256.0,
                                                           "texts": ["books.txt"]}}))
    record = systems.build(_args(tmp_path, steps=["big-lm"], big_lm_text=[str(tmp_path / "books.txt")]))
    assert record["big-lm"]["lmplz_seconds"] == 161 and record["big-lm"]["seconds"] == 256.0
    assert record["big-lm"]["ngrams"] == [3, 2] and record["big-lm"]["texts"] == ["books.txt"]
    big_ini = (big / "moses.untuned.ini").read_text().splitlines()
    assert "KENLM name=LM0 factor=0 path=MODEL_DIR/lm.en.5g.bin order=5" in big_ini
    both = out / systems.BOTH_DIR
    lines = (both / "moses.untuned.ini").read_text().splitlines()
    kenlm = [l for l in lines if l.startswith("KENLM")]
    assert kenlm == ["KENLM name=LM0 factor=0 path=MODEL_DIR/lm.en.5g.bin order=5",
                     "KENLM name=LM1 factor=0 path=MODEL_DIR/lm.en.5g.arpa.gz order=5"]
    assert lines[-2:] == ["LM0= 0.5", "LM1= 0.5"]
    for name in ("phrase-table.gz", "lm.en.5g.arpa.gz", systems.BIG_LM_BIN, "train.tok.lc.en.gz"):
        assert os.path.islink(both / name) and not os.path.isabs(os.readlink(both / name)), name
    assert (both / systems.BIG_LM_BIN).read_bytes() == b"mmap lm"
    assert "lm.en.5g.arpa.gz" not in os.listdir(big)
    assert all(os.path.exists(p) for p in systems.outputs("big-lm", str(out)))


def _args(tmp_path, **kw):
    from nlmfeature.cli import build_parser

    a = build_parser().parse_args(["bench", "system", "tatoeba", "-o", str(tmp_path / "s"),
                                   "--mirrors", str(tmp_path)])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


@pytest.mark.decoder
@pytest.mark.skipif(not os.access(os.path.join(ROOT, "bin", "extract"), os.X_OK)
                    or not _has_mirror(systems.FAST_ALIGN) or not _has_mirror(systems.TATOEBA[0]),
                    reason="needs MOSES_ROOT (a built Moses tree) and the Tatoeba and fast_align mirrors")
def test_the_whole_system_on_300_pairs(tmp_path):
    """fast_align built from its mirror, train-model.perl 4-9, KenLM, MERT for 2 iterations:
    the Multi30k system's layout, and a tuned system that translates."""
    out = tmp_path / "sys"
    argv = ["bench", "system", "tatoeba", "-o", str(out), "--mirrors", MIRRORS, "--heldout", HELDOUT,
            "--limit", "300", "--dev-size", "20", "--test-size", "20", "--no-newstest",
            "--moses-root", ROOT, "--max-iterations", "2", "--threads", "1"]
    if os.environ.get("FAST_ALIGN"):          # a fast_align build folder: not built again here
        argv += ["--fast-align", os.environ["FAST_ALIGN"]]
    assert cli_main(argv) == 0
    for name in ("phrase-table.gz", "reordering-table.wbe-msd-bidirectional-fe.gz", "lm.en.5g.arpa.gz",
                 "moses.untuned.ini", "moses.tuned.ini", "train.tok.lc.de.gz", "train.tok.lc.en.gz",
                 "train.align.grow-diag-final-and.gz"):
        assert (out / name).exists(), name
    ini = (out / "moses.untuned.ini").read_text()
    assert "path=MODEL_DIR/phrase-table.gz" in ini and "path=MODEL_DIR/lm.en.5g.arpa.gz" in ini
    assert "msd-bidirectional-fe" in ini
    tuned = (out / "moses.tuned.ini").read_text()
    assert "path=MODEL_DIR/phrase-table.gz" in tuned and tuned != ini
    res = json.loads((out / "results.json").read_text())
    assert set(res["bleu"]) == {"dev", "test"} and res["bleu"]["dev"] > 0
    n = sum(1 for _ in gzip.open(out / "train.tok.lc.en.gz"))
    assert sum(1 for _ in gzip.open(out / "train.align.grow-diag-final-and.gz")) == n
    record = json.loads((out / "build.json").read_text())
    assert record["train"]["phrase_table_entries"] > 500
    # the tuned system's k-best lists, in bench memory's --nbest-dir layout, which it reads
    nb = out / "nbest"
    last = record["nbest"]["dev_iteration"]
    assert last in (1, 2) and bench_memory.last_dev_nbest(str(nb)) == f"dev.iter{last}.100best.gz"
    test_ids = {int(l.split(" ||| ")[0]) for l in gzip.open(nb / "test.tuned.100best.gz", "rt")}
    assert test_ids == set(range(20)) and (nb / "moses.tuned.ini").read_text() == tuned
    for name in ("dev.ref.en.gz", "test.ref.en.gz", "dev.src.de.gz", "test.src.de.gz"):
        assert sum(1 for _ in gzip.open(nb / name)) == 20, name
    assert cli_main(["bench", "memory", "--quick", "--train", str(out / "train.tok.lc.en.gz"),
                     "--valid", str(out / "sets" / "dev.tok.lc.en"), "--test", str(out / "sets" / "test.tok.lc.en"),
                     "--nbest-dir", str(nb), "--widths", "8", "--direct-hash-spaces", "", "--json",
                     "--out", str(tmp_path / "memory")]) == 0
