"""Model files: round trip, memory-mapped sharing, float16 storage, and every kind of bad file."""
from __future__ import annotations

import json
import mmap
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nlmfeature
from helpers import BROWN_VALID, make_model, read_lines
from nlmfeature.core import modelfile
from nlmfeature.errors import ModelFileError


def test_round_trip_keeps_every_array_and_the_header(tmp_path):
    path = make_model(tmp_path, arch="nplm", word_width=8, hidden=16, hidden_layers=[8], output="class",
                      classes=9, direct_order=2, hash_space=101)
    header, arrays, checksum = modelfile.read_model(path)
    again = str(tmp_path / "again.nlm")
    assert nlmfeature.save(again, header, arrays) == checksum  # same content, same checksum
    h2, a2, c2 = modelfile.read_model(again)
    assert c2 == checksum and set(a2) == set(arrays)
    for name in arrays:
        assert np.array_equal(arrays[name], a2[name]), name
    assert {k: v for k, v in h2.items() if k != "arrays"} == {k: v for k, v in header.items() if k != "arrays"}
    assert modelfile.file_checksum(path) == checksum


def test_arrays_are_zero_copy_views_of_a_read_only_mapping(tmp_path):
    model = nlmfeature.load(make_model(tmp_path))
    for name, arr in model.arrays.items():
        assert not arr.flags.writeable, name
        base = arr
        while getattr(base, "base", None) is not None:
            base = base.base
        if isinstance(base, memoryview):
            base = base.obj
        assert isinstance(base, mmap.mmap), name
        assert arr.ctypes.data % 64 == 0, f"{name} is not 64-byte aligned"


def test_processes_share_one_copy_of_the_model(tmp_path):
    """A second process mapping the file reuses the page-cache pages of the first."""
    path = make_model(tmp_path, word_width=64, min_count=1)
    size = os.path.getsize(path)
    model = nlmfeature.load(path)
    for arr in model.arrays.values():  # touch every page
        float(np.asarray(arr, dtype=np.float64).sum()) if arr.dtype.kind == "f" else int(arr.sum())
    child = textwrap.dedent(f"""
        import numpy as np, nlmfeature
        m = nlmfeature.load({path!r})
        for a in m.arrays.values():
            a.sum()
        shared = rss = 0
        inside = False
        for line in open('/proc/self/smaps'):
            if line[0] in '0123456789abcdef' and '-' in line.split()[0]:
                inside = line.rstrip().endswith({os.path.basename(path)!r})
            elif inside and line.startswith('Shared_Clean:'):
                shared += int(line.split()[1])
            elif inside and line.startswith('Rss:'):
                rss += int(line.split()[1])
        print(shared, rss)
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    shared_kb, rss_kb = map(int, out.stdout.split())
    assert rss_kb * 1024 >= 0.9 * size
    assert shared_kb >= 0.9 * rss_kb, (shared_kb, rss_kb)


def test_float16_storage_halves_big_tables_and_keeps_scores_close(tmp_path):
    path = make_model(tmp_path, word_width=32, output="class", classes=30)
    header, arrays, _ = modelfile.read_model(path)
    half = str(tmp_path / "half.nlm")
    nlmfeature.save(half, header, arrays, half=True)
    assert os.path.getsize(half) < 0.6 * os.path.getsize(path)
    full, small = nlmfeature.load(path), nlmfeature.load(half)
    assert small.header["storage"] == "float16"
    lines = read_lines(BROWN_VALID, 100)
    p_full, p_half = full.perplexity(lines).perplexity, small.perplexity(lines).perplexity
    assert abs(p_half / p_full - 1) < 1e-3


# ---- bad files -------------------------------------------------------------------------

@pytest.fixture()
def good(tmp_path):
    return make_model(tmp_path)


def _rewrite(path, fn):
    data = bytearray(open(path, "rb").read())
    fn(data)
    open(path, "wb").write(bytes(data))


def _expect(path, *fragments):
    with pytest.raises(ModelFileError) as info:
        nlmfeature.load(path)
    msg = str(info.value)
    assert path in msg
    for f in fragments:
        assert f in msg, msg


def test_missing_file(tmp_path):
    _expect(str(tmp_path / "nope.nlm"), "cannot open")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.nlm"
    p.write_bytes(b"")
    _expect(str(p), "empty")


def test_not_a_model(tmp_path):
    p = tmp_path / "text.nlm"
    p.write_text("hello world, this is not a model file at all; " * 3)
    _expect(str(p), "bad magic")


def test_nplm_text_file_gets_a_hint(tmp_path):
    p = tmp_path / "nplm.txt"
    p.write_text("\\config\nversion 1\n" + "x" * 100)
    _expect(str(p), "nlmfeature convert")


def test_truncated(good):
    _rewrite(good, lambda d: d.__delitem__(slice(len(d) - 1000, None)))
    _expect(good, "truncated")


def test_trailing_garbage(good):
    _rewrite(good, lambda d: d.extend(b"garbage"))
    _expect(good, "unexpected bytes")


def test_corrupted_byte_fails_the_checksum(good):
    def flip(d):
        d[len(d) // 2] ^= 0x40
    _rewrite(good, flip)
    _expect(good, "checksum")


def test_wrong_version(good):
    _rewrite(good, lambda d: struct.pack_into("<I", d, 8, 99))
    _expect(good, "version 99")


def _rewrite_header(path, change):
    """Change the JSON header and re-seal the file (valid checksum), as a buggy writer would."""
    header, arrays, _ = modelfile.read_model(path)
    raw = open(path, "rb").read()
    _, _, _, hoff, hlen, total, _ = struct.unpack_from("<8sIIQQQ8s", raw)
    h = json.loads(raw[hoff:hoff + hlen])
    change(h)
    new = json.dumps(h, sort_keys=True, separators=(",", ":")).encode()
    assert len(new) <= hlen
    new += b" " * (hlen - len(new))
    body = raw[64:hoff] + new + raw[hoff + hlen:]
    import hashlib
    digest = hashlib.blake2b(body, digest_size=8).digest()
    pre = bytearray(raw[:64])
    pre[40:48] = digest
    open(path, "wb").write(bytes(pre) + body)


def test_wrong_architecture_shape(good):
    _rewrite_header(good, lambda h: h.__setitem__("embed_dim", h["embed_dim"] + 1))
    _expect(good, "architecture")


def test_unknown_output_layer(good):
    _rewrite_header(good, lambda h: h["output"].__setitem__("type", "mixture"))
    _expect(good, "unknown output layer")


def test_array_outside_the_file(good):
    def move(h):
        h["arrays"]["embeddings"]["offset"] = 1 << 40
    _rewrite_header(good, move)
    _expect(good, "embeddings")


def test_corrupted_header_json(good):
    def scramble(d):
        d[70:80] = b"}}}}}}}}}}"
    _rewrite(good, scramble)
    _expect(good)  # checksum or header error, never a crash


def test_writer_refuses_inconsistent_models(tmp_path, good):
    header, arrays, _ = modelfile.read_model(good)
    arrays = dict(arrays)
    arrays["output.bias"] = arrays["output.bias"][:-1]
    with pytest.raises(ModelFileError, match="inconsistent"):
        nlmfeature.save(str(tmp_path / "bad.nlm"), header, arrays)
    assert not (tmp_path / "bad.nlm").exists()


def test_write_is_atomic_and_replaces(tmp_path, good):
    header, arrays, checksum = modelfile.read_model(good)
    target = tmp_path / "target.nlm"
    target.write_bytes(b"old content")
    nlmfeature.save(str(target), header, arrays)
    assert modelfile.file_checksum(str(target)) == checksum
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".nlm-")] == []
