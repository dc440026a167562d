# cython: language_level=3
"""Native scorer: computes n-gram log-probabilities of a loaded model.

The model is a read-only :c:type:`ModelC` of pointers into the memory-mapped model file;
each thread owns a :c:type:`SessionC` holding its work buffers and per-sentence caches.
All scoring functions are ``nogil`` and touch no Python object.  Scores are natural logs.
"""
cimport cython
from libc.math cimport exp, expf, log, log1p, tanhf, INFINITY, NAN, isnan
from libc.stdint cimport int8_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset
from posix.unistd cimport close
from cpython.pycapsule cimport PyCapsule_New

cdef extern from "<stdlib.h>" nogil:
    void* aligned_alloc(size_t alignment, size_t size)

cdef extern from * nogil:
    void __builtin_prefetch(const void* p)

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)
    int MADV_HUGEPAGE

cdef extern from "../../src/nlmfeature/decoder/capi/nlmfeature.h":
    enum:
        NLM_DEFAULT_CACHE_ENTRIES

#: default bound of the per-sentence context / normaliser caches (NLM_DEFAULT_CACHE_ENTRIES
#: of nlmfeature.h, the one place it is spelled)
DEFAULT_CACHE_ENTRIES = NLM_DEFAULT_CACHE_ENTRIES
#: whether this build reads float16-stored rows as stored (F16C; ModelC.half)
HALF_ROWS = bool(NLM_HAVE_HALF)

import os

import numpy as np
cimport numpy as cnp

cnp.import_array()

ACTIVATIONS = {"identity": ACT_IDENTITY, "sigmoid": ACT_SIGMOID, "relu": ACT_RELU,
               "rectifier": ACT_RELU, "tanh": ACT_TANH, "hardtanh": ACT_HARDTANH}
COMBINERS = {"none": COMBINE_NONE, "max": COMBINE_MAX, "add": COMBINE_ADD, "mul": COMBINE_MUL}
OUTPUTS = {"unnormalised": OUT_UNNORMALISED, "softmax": OUT_SOFTMAX, "class": OUT_CLASS,
           "tree": OUT_TREE}

# The scorer is one extension module in parts, one file per job, in dependency order:
include "_scorer_kernels.pxi"
include "_scorer_hashing.pxi"
include "_scorer_table.pxi"
include "_scorer_forward.pxi"
include "_scorer_outputs.pxi"
include "_scorer_sessions.pxi"
include "_scorer_wrappers.pxi"
