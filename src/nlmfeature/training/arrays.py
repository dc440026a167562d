"""Large training arrays on transparent huge pages.

The trainer's big matrices (embeddings, output rows, direct-feature weights, their AdaGrad
sums and gradients) are read and written at random rows; with 4 KiB pages nearly every such
access misses the TLB once the arrays outgrow a few megabytes.  :func:`zeros` and
:func:`copy` put arrays of 2 MiB and more on anonymous memory advised ``MADV_HUGEPAGE``
before it is first touched (Linux; the kernel falls back to small pages where huge ones are
unavailable, and other systems get ordinary numpy arrays).
"""
from __future__ import annotations

import mmap
from typing import Sequence, Union

import numpy as np

#: arrays at least this large go on huge pages
HUGE_MIN_BYTES = 2 << 20


def zeros(shape: Union[int, Sequence[int]], dtype=np.float32) -> np.ndarray:
    """A zero-filled array, on huge pages when large (see the module's note)."""
    dtype = np.dtype(dtype)
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_MIN_BYTES or advice is None:
        return np.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(advice)
    except OSError:
        pass
    return np.frombuffer(buf, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)


def copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``a``, on huge pages when large."""
    out = zeros(a.shape, a.dtype)
    np.copyto(out, a)
    return out


def zeros_like(a: np.ndarray) -> np.ndarray:
    """:func:`zeros` of ``a``'s shape and type."""
    return zeros(a.shape, a.dtype)
