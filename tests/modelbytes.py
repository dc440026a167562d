"""Re-seal model files after changing their header or array bytes (valid checksum and length),
as a buggy writer or an attacker would: the fuzz suite (tests/fuzz.py) and the tests of model
validation (tests/test_boundary.py) use it to reach the checks behind the checksum."""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Callable, Dict, Optional

PREAMBLE = struct.Struct("<8sIIQQQ8s16s")
ALIGN = 64


def split(raw: bytes):
    """(preamble fields, header bytes, bytes after the header) of a model file."""
    f = PREAMBLE.unpack_from(raw, 0)
    hoff, hlen = f[3], f[4]
    return f, raw[hoff:hoff + hlen], raw[hoff + hlen:]


def header_of(raw: bytes) -> dict:
    return json.loads(split(raw)[1])


def seal(fields, header: bytes, tail: bytes) -> bytes:
    """A model file with this header and the bytes after it; length and checksum recomputed."""
    body = header + tail
    digest = hashlib.blake2b(body, digest_size=8).digest()
    pre = PREAMBLE.pack(fields[0], fields[1], fields[2], 64, len(header), 64 + len(body), digest, fields[7])
    return pre + body


def rewrite(raw: bytes, change_header: Optional[Callable[[dict], object]] = None,
            arrays: Optional[Dict[str, Callable[[bytearray, dict], None]]] = None,
            header_bytes: Optional[bytes] = None) -> bytes:
    """Change a model file and re-seal it.

    ``change_header(h)`` edits the parsed JSON header in place (or returns a replacement
    object); ``arrays[name](buf, entry)`` edits the bytes of an array in place (``buf`` is
    the whole file after the header, ``entry`` the array's table entry with ``start`` added:
    its position in ``buf``); ``header_bytes`` replaces the header text outright.  Array
    offsets are moved when a longer header pushes the data back.
    """
    fields, hdr, tail = split(raw)
    hoff, hlen = fields[3], fields[4]
    tail = bytearray(tail)
    h = json.loads(hdr)
    for name, edit in (arrays or {}).items():
        e = dict(h["arrays"][name])
        e["start"] = e["offset"] - (hoff + hlen)
        edit(tail, e)
    if header_bytes is None and change_header is None:
        return seal(fields, hdr, bytes(tail))
    if header_bytes is None:
        new = change_header(h)
        h = h if new is None else new
    delta = 0
    while True:
        if header_bytes is not None:
            text = header_bytes
        else:
            if delta and isinstance(h, dict) and isinstance(h.get("arrays"), dict):
                for e in h["arrays"].values():
                    if isinstance(e, dict) and type(e.get("offset")) is int:
                        e["offset"] += step
            text = json.dumps(h, sort_keys=True).encode("utf-8")
        if len(text) <= hlen + delta:
            return seal(fields, text + b" " * (hlen + delta - len(text)), bytes(tail))
        if header_bytes is not None:  # no offsets to move: grow by whole alignment units
            delta = (len(text) - hlen + ALIGN - 1) // ALIGN * ALIGN
            continue
        step = (len(text) - hlen - delta + ALIGN - 1) // ALIGN * ALIGN
        delta += step
