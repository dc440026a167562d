"""Thread counts of the dense (BLAS) and sparse (OpenMP) parts of training.

``--threads N`` sets both: the OpenMP team of the Cython kernels is passed explicitly to
each call, and the BLAS pool is resized at run time -- through ``threadpoolctl`` when it is
installed, otherwise by calling OpenBLAS's own ``*openblas_set_num_threads*`` function in
the library numpy loaded (found in /proc/self/maps).  Setting ``OPENBLAS_NUM_THREADS``
before Python starts also works; nothing here unsets it.
"""
from __future__ import annotations

import ctypes
import os
import re
from typing import Optional

def kernel_threads(threads: int, dense: bool = False) -> int:
    """OpenMP team size for the Cython kernels.

    GNU OpenMP's idle threads spin and then starve OpenBLAS's threads on a machine with as
    many cores as threads: measured on a 2-core machine, 2+2 threads trained about 10x *slower*
    than 1+1 with libgomp's default policy.  The package therefore sets ``OMP_WAIT_POLICY=passive``
    with a short ``GOMP_SPINCOUNT`` (see ``nlmfeature/__init__.py``), and the kernels use several
    threads only when the policy is passive (it is read when the OpenMP runtime loads, before
    this code runs); otherwise they run on one thread and BLAS gets the cores.

    ``dense``: the model's minibatch is dominated by matrix products that BLAS runs on its own
    threads (hidden layers, full context matrices, a softmax over the vocabulary).  Even the
    short spin of idle kernel threads then slows BLAS (NPLM 256, 2 threads: 20-25k words/s
    against 30-34k with the kernels on one thread), so the kernels take one thread.
    """
    threads = max(1, int(threads))
    if dense:
        return 1
    if os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive":
        return threads
    return 1


_SETTERS = ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads", "openblas_set_num_threads64_")
_GETTERS = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_",
            "scipy_openblas_get_num_threads", "openblas_get_num_threads64_")


def _openblas_libs():
    import numpy  # noqa: F401  (make sure numpy's BLAS is loaded)
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return []
    libs = []
    for path in sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps))):
        try:
            libs.append(ctypes.CDLL(path))
        except OSError:
            pass
    return libs


def set_blas_threads(n: int) -> bool:
    """Resize the BLAS thread pool; returns whether it could be done."""
    n = max(1, int(n))
    try:
        from threadpoolctl import threadpool_limits  # type: ignore

        threadpool_limits(limits=n, user_api="blas")
        return True
    except ImportError:
        pass
    done = False
    for lib in _openblas_libs():
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                done = True
                break
    return done


def blas_threads() -> Optional[int]:
    """The BLAS pool size, if it can be read."""
    for lib in _openblas_libs():
        for name in _GETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                return int(fn())
    return None
