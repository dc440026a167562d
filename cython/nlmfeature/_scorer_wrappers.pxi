# Included by _scorer.pyx (one compilation unit): Python wrappers: NativeModel (a ModelC over the mapped arrays) and Session.

# ---------------------------------------------------------------------------------------
# Python wrappers
# ---------------------------------------------------------------------------------------

cdef const float* fptr(arrays, name, required=True) except? NULL:
    a = arrays.get(name)
    if a is None:
        if required:
            raise ValueError(f"model has no array {name!r}")
        return NULL
    _check(a, name, np.float32)
    return <const float*>cnp.PyArray_DATA(a)


cdef _check(a, name, dtype):
    if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"array {name!r} must be a C-contiguous {np.dtype(dtype).name} array")


cdef const void* rawptr(arrays, name, dtype) except? NULL:
    a = arrays.get(name)
    if a is None:
        raise ValueError(f"model has no array {name!r}")
    _check(a, name, dtype)
    return <const void*>cnp.PyArray_DATA(a)


def line_aligned_zeros(n, dtype):
    """A zeroed array of ``n`` items whose data starts on a 64-byte cache line."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.zeros(n * itemsize + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start:start + n * itemsize].view(dtype)


def direct_store_plan(counts, int itemsize):
    """The lines of a direct-feature store (:attr:`ModelC.direct_lines`) for weights whose
    non-zero counts per 16 indices are ``counts``, each weight ``itemsize`` bytes: ``(gshift,
    words, cap, spilled, line_counts)``, 2^gshift indices per 64-byte line (16 .. 256),
    ``words`` bitmap words and room for ``cap`` weights in each, ``spilled`` weights past a
    line's room, and each line's non-zero count.  The fewest bytes among the layouts that
    spill at most 1 in 50 weights (a spilled weight costs a second cache miss), else 16
    indices a line: a sparse store (few trained n-grams) takes wide lines, a denser one
    narrow; ``gshift`` 0 (and ``line_counts`` None): no lines, the weights as they are (a
    dense store, where the bits would cost more than the zeros they leave out)."""
    total = int(counts.sum(dtype=np.int64))
    c = counts.astype(np.int32)
    best = None
    for gshift in range(4, 9):
        if gshift > 4:
            if c.shape[0] % 2:
                c = np.append(c, np.int32(0))
            c = c[0::2] + c[1::2]
        words = max(1, (1 << gshift) // 64)
        cap = (64 - 8 * words - 4) // itemsize
        spilled = int(np.maximum(c - cap, 0).sum(dtype=np.int64))
        nbytes = c.shape[0] * 64 + spilled * itemsize
        if (gshift == 4 or spilled * 50 <= total) and (best is None or nbytes < best[0]):
            best = (nbytes, gshift, words, cap, spilled, c)
    if counts.shape[0] * 16 * itemsize <= best[0]:   # (a bit per weight saves nothing)
        return 0, 0, 0, 0, None
    return best[1:]


cdef class NativeModel:
    """The C view of a model's arrays.  Keeps the arrays (and so the mmap) alive.

    ``header`` is the parsed model-file header; ``arrays`` maps array names to numpy arrays
    whose shapes :mod:`nlmfeature.core.modelfile` has already validated.
    """
    cdef ModelC m
    cdef object _arrays
    cdef object _extra
    cdef readonly object path
    cdef void* _copies[NLM_MAX_COPIES]
    cdef int _ncopies
    cdef bint _huge
    #: bytes of the model's arrays this process reads from its own huge-page copies (hot)
    cdef readonly int64_t copied_bytes

    def __cinit__(self, *args, **kwargs):
        self.m.file_fd = -1

    def __dealloc__(self):
        if self.m.file_fd >= 0:
            close(self.m.file_fd)
            self.m.file_fd = -1
        self._free_copies()

    cdef void _free_copies(self) noexcept:
        cdef int i
        for i in range(self._ncopies):
            free(self._copies[i])
        self._ncopies = 0
        self.copied_bytes = 0

    cdef const float* hot(self, arrays, name, required=True) except? NULL:
        """``fptr`` of an array the scorer reads at scattered rows (embeddings, output
        weights, first-layer tables; direct-feature weights are read from their packed
        non-zero copy instead): from 2 MB up, a copy of it in
        transparent huge pages (:c:func:`alloc_huge`), owned by this model.  The mapped
        file's 4 KB pages cost a Moses search a TLB miss on nearly every such read (its own
        data fills the TLB); one process's copy costs the array's size in memory, once for
        all its threads.  ``NLMFEATURE_HUGE_PAGES=0`` in the environment reads the mapping
        itself (processes then share the page cache's one copy)."""
        if fptr(arrays, name, required) == NULL:
            return NULL
        return <const float*>self._hot_copy(arrays[name])

    cdef const void* _hot_copy(self, a) except? NULL:
        """The data of the array ``a``, or this model's huge-page copy of it (:meth:`hot`),
        copied a piece at a time: the mapped file's pages of each piece leave the process as
        it is copied (release_pages), so the file and the copy are never both resident.  An
        array on huge pages of this process's own already (a float16 array widened at load,
        training parameters) is read in place."""
        from nlmfeature.core.modelfile import in_huge_buffer, release_pages

        cdef const char* p = <const char*>cnp.PyArray_DATA(a)
        cdef size_t n = a.nbytes, s, k
        cdef size_t step = 1 << 22
        cdef char* q
        if in_huge_buffer(a):
            return <const void*>p
        q = <char*>self._alloc_copy(n)
        if q == NULL:
            return <const void*>p
        flat = a.reshape(-1).view(np.uint8)
        for s in range(0, n, step):
            k = min(step, n - s)
            memcpy(q + s, p + s, k)
            release_pages(flat[s:s + k])
        return <const void*>q

    cdef object _own_array(self, int64_t n, dtype, bint zero):
        """A new array of ``n`` items of ``dtype`` (zeroed with ``zero``) for a table the
        scorer reads at random places (the packed direct weights and their index): in this
        model's huge-page memory from 2 MB up (:meth:`_alloc_copy`, freed with the model), so
        that its reads do not also miss the TLB, else a line-aligned array kept in
        ``_extra``."""
        cdef size_t nbytes = <size_t>n * np.dtype(dtype).itemsize
        cdef void* q = self._alloc_copy(nbytes)
        if q == NULL:
            a = line_aligned_zeros(n, dtype) if zero else np.empty(n, dtype=dtype)
            self._extra.append(a)
            return a
        if zero:
            memset(q, 0, nbytes)
        return np.asarray(<unsigned char[:nbytes]><unsigned char*>q).view(dtype)

    def _direct_lines(self, weights, int gshift, int words, int cap, int64_t spilled, line_counts):
        """The direct-feature store by lines (:attr:`ModelC.direct_lines`, laid out as
        :func:`direct_store_plan` says) of ``weights``, read 1M items at a time (so that the
        temporaries of a piece stay a few megabytes beside the store: a decoder's peak memory)."""
        from nlmfeature.core.modelfile import release_pages
        cdef int64_t n = weights.shape[0], s, step = 1 << 20
        cdef int group = 1 << gshift, item = weights.dtype.itemsize
        cdef int line_items = 64 // item, head = (8 * words + 4) // item
        cdef int64_t nlines = line_counts.shape[0]
        store = self._own_array(nlines * line_items + spilled, weights.dtype, True)
        lines = store[:nlines * line_items]
        by_item = lines.reshape(nlines, line_items)
        by_byte = lines.view(np.uint8).reshape(nlines, 64)
        spill = store[nlines * line_items:]
        excess = np.maximum(line_counts - cap, 0).astype(np.int64)
        base = np.cumsum(excess) - excess   # each line's first spilled weight
        lines.view(np.uint32).reshape(nlines, 16)[:, 2 * words] = base
        del excess
        for s in range(0, n, step):
            block = weights[s:s + step]
            first = s >> gshift
            nonzero = np.zeros(-(-block.shape[0] // group) * group, dtype=bool)
            np.not_equal(block, 0, out=nonzero[:block.shape[0]])
            nl = nonzero.shape[0] // group
            by_byte[first:first + nl, :group // 8] = np.packbits(nonzero, bitorder="little").reshape(nl, group // 8)
            rank = np.cumsum(nonzero.reshape(nl, group), axis=1, dtype=np.int16).reshape(-1)
            at = np.flatnonzero(nonzero)
            r = rank[at] - 1
            line = first + (at >> gshift)
            held = r < cap
            by_item[line[held], head + r[held]] = block[at[held]]
            held = ~held
            spill[base[line[held]] + r[held] - cap] = block[at[held]]
            release_pages(block)
            del block, nonzero, rank, at, r, line, held
        return store

    cdef void* _alloc_copy(self, size_t n) noexcept:
        """Huge-page memory for a copy of ``n`` bytes, owned by this model; NULL where the
        array is read in place (small, no huge pages wanted, no memory)."""
        cdef void* q
        if not self._huge or self._ncopies == NLM_MAX_COPIES or n < NLM_HUGE_PAGE:
            return NULL
        q = alloc_huge(n, 0)
        if q == NULL:
            return NULL
        self._copies[self._ncopies] = q
        self._ncopies += 1
        self.copied_bytes += n
        return q

    def __init__(self, dict header, dict arrays, bint use_tables=True, bint half_rows=True,
                 bint hot_copies=True):
        """``arrays`` may hold the float16 arrays of a float16 model file as stored
        (:func:`nlmfeature.core.modelfile.open_model` with ``widen=False``): the scorer reads
        its embeddings and output rows as halves where the build has F16C (the embeddings when
        every first-layer branch is diagonal), and widens any other float16 array to float32.
        ``half_rows=False`` reads a float16 model's float32 widening instead of its half
        rows (the same bits, the tests compare the two).  ``hot_copies=False`` reads the
        arrays in place instead of huge-page copies (:meth:`hot`): for arrays already in
        memory, such as a training run's parameters."""
        from nlmfeature.core.modelfile import release_pages, widen_arrays

        cdef int k
        cdef ModelC* m = &self.m
        self._arrays = arrays
        self._extra = []
        # float16 arrays as stored: kept as halves where every path that reads them has a
        # half kernel, else widened here (once; the mapped file's pages then released)
        halves = set()
        if header.get("storage") == "float16" and NLM_HAVE_HALF and half_rows:
            halves.update(("output.weight", "direct.weights"))
            if all(br["diagonal"] for br in header["branches"]):
                halves.update(("embeddings", "source.embeddings"))
        arrays = widen_arrays(arrays, keep=halves)
        self._extra.append(arrays)
        self.path = None
        if m.file_fd >= 0:
            close(m.file_fd)
        memset(m, 0, sizeof(ModelC))
        m.file_fd = -1
        self._free_copies()
        self._huge = hot_copies and os.environ.get("NLMFEATURE_HUGE_PAGES", "1") != "0"
        m.order = header["order"]
        if not 1 <= m.order <= NLM_MAX_ORDER:
            raise ValueError(f"order {m.order} is outside 1..{NLM_MAX_ORDER}")
        m.ctx_len = m.order - 1
        m.vocab_size = header["vocab_size"]
        m.embed_dim = header["embed_dim"]
        sp = header["special"]
        m.unk, m.bos, m.eos, m.null = sp["<unk>"], sp["<s>"], sp["</s>"], sp["<null>"]
        m.embeddings = self.hot(arrays, "embeddings") if arrays["embeddings"].dtype != np.float16 else NULL
        branches = header["branches"]
        if not 1 <= len(branches) <= NLM_MAX_BRANCHES:
            raise ValueError(f"between 1 and {NLM_MAX_BRANCHES} first-layer branches are supported")
        m.n_branches = len(branches)
        m.combine = COMBINERS[header.get("combine", "none")]
        m.max_width = m.embed_dim
        for k, br in enumerate(branches):
            m.branches[k].hidden = br["hidden"]
            m.branches[k].diagonal = br["diagonal"]
            m.branches[k].activation = ACTIVATIONS[br["activation"]]
            m.branches[k].weights = fptr(arrays, f"branch{k}.weights")
            m.branches[k].bias = fptr(arrays, f"branch{k}.bias", False)
            m.branches[k].tables = self.hot(arrays, f"branch{k}.tables", False)
            m.max_width = max(m.max_width, br["hidden"])
        layers = header["layers"]
        if len(layers) > NLM_MAX_LAYERS:
            raise ValueError(f"at most {NLM_MAX_LAYERS} extra hidden layers are supported")
        m.n_layers = len(layers)
        for k, ly in enumerate(layers):
            m.layers[k].n_in = ly["n_in"]
            m.layers[k].n_out = ly["n_out"]
            m.layers[k].activation = ACTIVATIONS[ly["activation"]]
            m.layers[k].weight = fptr(arrays, f"layer{k}.weight")
            m.layers[k].bias = fptr(arrays, f"layer{k}.bias", False)
            # inputs that a ReLU produced are sparse: keep a transposed copy to skip zeros
            prev_act = branches[0]["activation"] if k == 0 else layers[k - 1]["activation"]
            if ACTIVATIONS[prev_act] == ACT_RELU and header.get("combine", "none") != "mul":
                wt = np.ascontiguousarray(arrays[f"layer{k}.weight"].T)
                self._extra.append(wt)
                m.layers[k].weight_t = <const float*>cnp.PyArray_DATA(wt)
            m.max_width = max(m.max_width, ly["n_out"], ly["n_in"])
        out = header["output"]
        m.out_dim = out["dim"]
        m.max_width = max(m.max_width, m.out_dim)
        m.output_type = OUTPUTS[out["type"]]
        m.out_weight = self.hot(arrays, "output.weight") if arrays["output.weight"].dtype != np.float16 else NULL
        m.out_bias = fptr(arrays, "output.bias")
        if m.output_type == OUT_CLASS:
            m.n_classes = out["classes"]
            m.class_weight = fptr(arrays, "class.weight")
            # (D, C) copy padded to 128 columns: the class logits in one register-blocked pass
            m.n_classes_padded = (m.n_classes + 127) // 128 * 128
            cwt = np.zeros((m.out_dim, m.n_classes_padded), dtype=np.float32)
            cwt[:, :m.n_classes] = arrays["class.weight"].T
            self._extra.append(cwt)
            m.class_weight_t = <const float*>cnp.PyArray_DATA(cwt)
            m.class_bias = fptr(arrays, "class.bias")
            m.word_class = <const int32_t*>rawptr(arrays, "class.of_word", np.int32)
            m.class_start = <const int32_t*>rawptr(arrays, "class.start", np.int32)
            m.class_members = <const int32_t*>rawptr(arrays, "class.members", np.int32)
        elif m.output_type == OUT_TREE:
            m.n_nodes = out["nodes"]
            m.tree_weight = fptr(arrays, "tree.weight")
            m.tree_bias = fptr(arrays, "tree.bias")
            m.path_start = <const int64_t*>rawptr(arrays, "tree.path_start", np.int64)
            m.path_node = <const int32_t*>rawptr(arrays, "tree.path_node", np.int32)
            m.path_sign = <const int8_t*>rawptr(arrays, "tree.path_sign", np.int8)
        # log-bilinear normalised outputs: normalisers from per-sentence position terms in
        # sessions that ask for them (ModelC.linear_out; other sessions take the hidden-vector
        # path, which the tests compare with it)
        m.linear_out = (m.n_branches == 1 and m.n_layers == 0 and m.branches[0].activation == ACT_IDENTITY
                        and (m.output_type == OUT_SOFTMAX or m.output_type == OUT_CLASS))
        if m.output_type == OUT_CLASS:
            starts = np.asarray(arrays["class.start"], dtype=np.int64)
            members = np.asarray(arrays["class.members"], dtype=np.int64)
            pos = np.zeros(m.vocab_size, dtype=np.int32)
            pos[members] = np.arange(members.shape[0]) - np.repeat(starts[:-1], np.diff(starts))
            self._extra.append(pos)
            m.class_pos = <const int32_t*>cnp.PyArray_DATA(pos)
        direct = header.get("direct")
        if direct:
            m.direct_order = direct["order"]
            m.hash_space = direct["hash_space"]
            weights = arrays.get("direct.weights")
            if weights is None or weights.dtype != np.float16:
                fptr(arrays, "direct.weights")  # (checked; the scorer reads its copy by line)
            else:
                _check(weights, "direct.weights", np.float16)
            if not 1 <= m.direct_order <= m.order:
                raise ValueError("direct feature order must be between 1 and the model order")
            # the store by line (ModelC.direct_lines, direct_store_plan): each 64-byte line
            # the non-zero bits of 2^gshift indices and, beside them, their weights, so that a
            # lookup's feature waits for one cache miss (a bit then a packed weight elsewhere
            # cost two), zero weights (most of the table) taking no room; or, where few are
            # zero, the weights as they are.  Built a piece at a time (a mapped file's pieces
            # leave this process's memory as they are read: release_pages), with no
            # temporary the size of the whole store
            weights = np.asarray(arrays["direct.weights"])
            n = weights.shape[0]
            step = 1 << 22                      # (a multiple of the largest line's indices)
            counts = np.zeros(-(-n // 16), dtype=np.uint8)
            for s in range(0, n, step):
                block = weights[s:s + step]
                nonzero = np.zeros(-(-block.shape[0] // 16) * 16, dtype=bool)
                np.not_equal(block, 0, out=nonzero[:block.shape[0]])
                counts[s // 16:s // 16 + nonzero.shape[0] // 16] = nonzero.reshape(-1, 16).sum(axis=1, dtype=np.uint8)
                release_pages(block)
            item = weights.dtype.itemsize
            gshift, words, cap, spilled, line_counts = direct_store_plan(counts, item)
            del counts
            if gshift == 0:  # dense: the weights as they are, a -0.0 as +0.0
                store = self._own_array(n, weights.dtype, True)
                for s in range(0, n, step):
                    block = weights[s:s + step]
                    np.copyto(store[s:s + step], block, where=block != 0)
                    release_pages(block)
                    del block
            else:
                store = self._direct_lines(weights, gshift, words, cap, spilled, line_counts)
                m.direct_lines = <const uint64_t*>cnp.PyArray_DATA(store)
                m.direct_gshift = gshift
                m.direct_words = words
                m.direct_cap = cap
                m.direct_line_items = 64 // item
                m.direct_head_items = (8 * words + 4) // item
                m.direct_spill = line_counts.shape[0] * m.direct_line_items
            del line_counts
            if store.dtype == np.float16:
                m.direct_packed_h = <const uint16_t*>cnp.PyArray_DATA(store)
            else:
                m.direct_packed = <const float*>cnp.PyArray_DATA(store)
            # the order-0 term of every word's (and class's) direct value, read from a small
            # array instead of a random place in the weights (direct_value_kind)
            for kind, n in ((0, m.vocab_size), (1, m.n_classes if m.output_type == OUT_CLASS else 0)):
                if n:
                    first = np.zeros(n, dtype=np.float64)
                    direct_first_fill(m, kind, n, <double*>cnp.PyArray_DATA(first))
                    self._extra.append(first)
                    m.direct_first[kind] = <const double*>cnp.PyArray_DATA(first)
        m.use_tables = use_tables
        m.key_len = m.ctx_len
        source = header.get("source")
        if source:
            m.src_window = source["window"]
            if not 1 <= m.src_window <= NLM_MAX_WINDOW or m.src_window % 2 == 0:
                raise ValueError(f"source window {m.src_window} is not an odd number in 1..{NLM_MAX_WINDOW}")
            m.src_vocab_size = source["vocab_size"]
            ssp = source["special"]
            m.src_unk, m.src_bos, m.src_eos, m.src_null = ssp["<unk>"], ssp["<s>"], ssp["</s>"], ssp["<null>"]
            m.src_embeddings = (self.hot(arrays, "source.embeddings")
                                if arrays["source.embeddings"].dtype != np.float16 else NULL)
            for k in range(m.n_branches):
                m.branches[k].src_tables = self.hot(arrays, f"branch{k}.source.tables", False)
                if (m.branches[k].tables == NULL) != (m.branches[k].src_tables == NULL):
                    raise ValueError("a joint model has tables for all positions or none")
            m.key_len = m.ctx_len + m.src_window
        # float16 rows: read as stored (ModelC.half)
        m.half = header.get("storage") == "float16"
        if m.half and NLM_HAVE_HALF and half_rows:
            m.embeddings_h = self.hot_half(arrays, "embeddings")
            m.out_weight_h = self.hot_half(arrays, "output.weight")
            if source:
                m.src_embeddings_h = self.hot_half(arrays, "source.embeddings")

    cdef const uint16_t* hot_half(self, arrays, name) except? NULL:
        """The float16 rows of an array: a float16 array as stored (:meth:`hot`: read in place
        or from a huge-page copy), or the halves of a float32 array widened from them, kept by
        this model (:meth:`hot`'s huge-page copy from 2 MB up); NULL (read the float32 array)
        where its values are not all exactly halves (a model built in memory)."""
        cdef void* q
        cdef cnp.npy_intp n
        a = arrays.get(name)
        if a is not None and a.dtype == np.float16:
            _check(a, name, np.float16)
            return <const uint16_t*>self._hot_copy(a)
        if a is None or a.dtype != np.float32:
            return NULL
        flat = a.reshape(-1)
        n = flat.shape[0]
        step = 1 << 22          # (bounded memory for the checks of a big array)
        for s in range(0, n, step):
            if not np.array_equal(flat[s:s + step].astype(np.float16).astype(np.float32), flat[s:s + step]):
                return NULL
        q = self._alloc_copy(n * 2)
        if q == NULL:           # read in place: an array of this model's own
            h = np.ascontiguousarray(a, dtype=np.float16)
            self._extra.append(h)
            return <const uint16_t*>cnp.PyArray_DATA(h)
        # written straight into the huge-page copy (no float16 array of the whole)
        h = cnp.PyArray_SimpleNewFromData(1, &n, cnp.NPY_FLOAT16, q)
        for s in range(0, n, step):
            h[s:s + step] = flat[s:s + step]
        return <const uint16_t*>q

    def watch_file(self, str path, int fd, tuple identity) -> None:
        """Take ownership of ``fd``, an open descriptor of the mapped model file, whose
        (st_dev, st_ino, size, mtime_ns) were ``identity`` when it was mapped: each sentence
        start then checks that the file was not changed in place (``nlm_model_file_changed``)."""
        if self.m.file_fd >= 0:
            close(self.m.file_fd)
        self.m.file_dev, self.m.file_ino, self.m.file_size, self.m.file_mtime_ns = identity
        self.m.file_fd = fd
        self.path = path

    def file_changed(self) -> bool:
        """Whether the model file was changed in place since it was loaded."""
        return bool(nlm_model_file_changed(&self.m))

    def check_file(self) -> None:
        """Raise :class:`nlmfeature.errors.ModelFileError` if the model file was changed in place."""
        if nlm_model_file_changed(&self.m):
            raise _changed_error(self.path)

    @property
    def order(self) -> int:
        return self.m.order

    @property
    def vocab_size(self) -> int:
        return self.m.vocab_size

    @property
    def half_rows(self) -> bool:
        """Whether the scorer reads this float16-stored model's embeddings and output rows as
        stored (half the bytes; the same scores as their float32 widening)."""
        return self.m.embeddings_h != NULL or self.m.out_weight_h != NULL

    @property
    def source_window(self) -> int:
        """Joint models: source-window width w (0 for a target-only model)."""
        return self.m.src_window

    @property
    def key_len(self) -> int:
        """Ids in a full context: w source-window ids, then n-1 target ids."""
        return self.m.key_len

    def source_window_ids(self, const int32_t[::1] source not None, int affiliation):
        """The w source ids around ``affiliation`` (see ``nlm_source_window``): position
        ``len(source)`` is ``</s>``, a negative affiliation gives ``<null>``s."""
        if self.m.src_window == 0:
            raise ValueError("not a joint model: it has no source window")
        out = np.empty(self.m.src_window, dtype=np.int32)
        cdef int32_t[::1] o = out
        cdef int32_t dummy = 0
        nlm_source_window(&self.m, &source[0] if source.shape[0] else &dummy, source.shape[0],
                          affiliation, &o[0])
        return out

    @property
    def own_bytes(self) -> int:
        """Bytes of this process's own memory the scorer holds for the model: its huge-page
        copies, the packed direct weights and their index, float16 arrays widened at load and
        the small tables built at load.  Not the mapped file's pages (shared, in the page
        cache), not arrays it was given in memory (a training run's), not the sessions."""
        from nlmfeature.core.modelfile import file_backed

        given = {id(a) for a in self._arrays.values()}
        seen = set()
        total = self.copied_bytes
        stack = list(self._extra)
        while stack:
            x = stack.pop()
            if isinstance(x, dict):
                stack.extend(x.values())
            elif isinstance(x, (tuple, list)):
                stack.extend(x)
            elif isinstance(x, np.ndarray) and id(x) not in given and id(x) not in seen \
                    and not file_backed(x):
                seen.add(id(x))
                total += x.nbytes
        return total

    @property
    def uses_tables(self) -> bool:
        return bool(self.m.use_tables and self.m.branches[0].tables != NULL)

    def capsule(self):
        """A PyCapsule holding the ``ModelC*`` (for the C ABI library)."""
        return PyCapsule_New(<void*>&self.m, b"nlmfeature.ModelC", NULL)

    def pad_context(self, const int32_t[::1] ids not None):
        """Padded n-1 context ids for a history (see the C function ``nlm_pad_context``)."""
        out = np.empty(max(self.m.ctx_len, 0), dtype=np.int32)
        cdef int32_t[::1] o = out
        cdef int32_t dummy = 0
        nlm_pad_context(&self.m, &ids[0] if ids.shape[0] else &dummy, ids.shape[0],
                        &o[0] if o.shape[0] else &dummy)
        return out

    def hidden(self, const int32_t[::1] padded not None):
        """Final hidden vector for a padded context (testing and the batched path)."""
        if padded.shape[0] != self.m.key_len:
            raise ValueError(f"a padded context has {self.m.key_len} ids")
        _check_context_ids(&self.m, padded, "the context")
        out = np.empty(self.m.out_dim, dtype=np.float32)
        b = np.empty(3 * self.m.max_width, dtype=np.float32)
        cdef float[::1] o = out, bb = b
        cdef int32_t dummy = 0
        cdef int W = self.m.max_width
        nlm_compute_hidden(&self.m, &padded[0] if padded.shape[0] else &dummy, &o[0], &bb[0], &bb[W], &bb[2 * W])
        return out

    def session(self, int64_t cache_entries=NLM_DEFAULT_CACHE_ENTRIES, int64_t ngram_entries=-1,
                bint position_terms=False):
        """A new scoring session (one per thread); ``cache_entries=0`` disables caching;
        ``ngram_entries`` bounds the exact n-gram cache (-1: automatic, 0: off);
        ``position_terms``: a decoder's session (see :meth:`nlmfeature.Model.session`)."""
        return Session(self, cache_entries, ngram_entries, position_terms)


def _changed_error(path):
    """The error for a model file overwritten in place under a running process."""
    from .errors import ModelFileError
    return ModelFileError(
        f"{path}: the model file was changed in place after it was loaded (its size or "
        "modification time differ); its memory mapping now holds other bytes, so this process "
        "stops scoring with it.  Replace a model by writing the new file next to it and "
        "renaming it over the old one (mv new.nlm live.nlm; nlmfeature's writers do this), "
        "never by copying over it; then reload.")


cdef _check_context_ids(const ModelC* m, a, what):
    """Like :func:`_check_ids` for full contexts: the first ``src_window`` columns hold
    source ids (joint models), the rest target ids."""
    arr = np.asarray(a)
    w = m.src_window
    if w == 0:
        _check_ids(arr, m.vocab_size, what)
        return
    if arr.ndim == 1:
        arr = arr[None, :]
    _check_ids(arr[:, :w], m.src_vocab_size, what + " (source window)")
    _check_ids(arr[:, w:], m.vocab_size, what)


cdef _check_ids(a, int64_t vocab_size, what):
    """Reject ids outside the vocabulary before they reach nogil code (no out-of-bounds reads)."""
    arr = np.asarray(a)
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise ValueError(f"{what} hold ids outside 0..{vocab_size - 1}; map words with the "
                         "model's vocabulary (unknown words -> <unk>)")


cdef class Session:
    """Per-thread scorer state: work buffers and the bounded per-sentence caches.

    One session must not be used by two threads at once; the model may be shared freely.
    """
    cdef SessionC* s
    cdef readonly NativeModel model

    def __cinit__(self, NativeModel model, int64_t cache_entries=NLM_DEFAULT_CACHE_ENTRIES, int64_t ngram_entries=-1,
                  bint position_terms=False):
        self.model = model
        self.s = nlm_session_new(&model.m, cache_entries, ngram_entries, position_terms)
        if self.s == NULL:
            raise MemoryError("could not allocate a scoring session")

    def __dealloc__(self):
        nlm_session_free(self.s)

    def begin_sentence(self, int64_t sentence_id=-1) -> None:
        """Start a new sentence: empties the per-sentence caches.  Raises
        :class:`nlmfeature.errors.ModelFileError` if the model file was changed in place
        since it was loaded (the session then refuses to score: NaN)."""
        if nlm_session_begin(self.s, sentence_id) != 0:
            raise _changed_error(self.model.path)

    def score(self, const int32_t[::1] history not None, int32_t word) -> float:
        """Natural-log score of ``word`` after ``history`` (ids, oldest first, padded as needed)."""
        cdef int32_t dummy = 0
        return nlm_score(self.s, &history[0] if history.shape[0] else &dummy, history.shape[0], word)

    def score_padded(self, const int32_t[:, ::1] contexts not None, const int32_t[::1] words not None):
        """Score N n-grams one lookup at a time (through the caches); contexts are padded, (N, n-1)."""
        cdef int64_t n = words.shape[0], i
        cdef int c = self.model.m.key_len
        if contexts.shape[0] != n or (n and contexts.shape[1] != c):
            raise ValueError(f"contexts must have shape ({n}, {c})")
        _check_context_ids(&self.model.m, contexts, "contexts")
        out = np.empty(n, dtype=np.float64)
        cdef double[::1] o = out
        cdef int32_t V = self.model.m.vocab_size, unk = self.model.m.unk, w
        cdef int32_t dummy = 0
        cdef const int32_t* base = &contexts[0, 0] if (n and c) else &dummy
        with nogil:
            for i in range(n):
                w = words[i]
                if w < 0 or w >= V:
                    w = unk
                o[i] = nlm_score_padded(self.s, base + i * c, w)
        return out

    def direct_vocab(self, const int32_t[:, ::1] contexts not None, float[:, ::1] out not None) -> None:
        """``out[i, w]``: the direct-feature value every word ``w`` gets after padded context
        ``contexts[i]`` (the float that a softmax normaliser adds to the word's logit), for a
        model with direct features; the batched scorer adds it to its matrix products."""
        cdef int64_t n = contexts.shape[0], i
        cdef int c = self.model.m.key_len
        cdef int32_t V = self.model.m.vocab_size, w
        cdef uint64_t states[NLM_MAX_ORDER + 1]
        cdef const double* dv
        if not self.model.m.direct_order:
            raise ValueError("the model has no direct features")
        if (n and contexts.shape[1] != c) or out.shape[0] != n or out.shape[1] != V:
            raise ValueError(f"contexts must have shape (N, {c}) and out (N, {V})")
        _check_context_ids(&self.model.m, contexts, "contexts")
        with nogil:
            for i in range(n):
                direct_states(&self.model.m, &contexts[i, 0], 0, states)
                dv = direct_vector(self.s, 0, states, &contexts[i, 0], -2, NULL, V)
                for w in range(V):
                    out[i, w] = <float>dv[w]

    def score_stream(self, const int32_t[:, ::1] contexts not None, const int32_t[::1] words not None,
                     const int64_t[::1] sentence_starts not None):
        """Like :meth:`score_padded`, but begins a new sentence at each index in ``sentence_starts``.

        Returns the sum of the scores (the benchmark's hot loop; runs without the GIL).
        """
        cdef int64_t n = words.shape[0], i, k = 0, ns = sentence_starts.shape[0]
        cdef int c = self.model.m.key_len
        cdef double total = 0
        if contexts.shape[0] != n or (n and contexts.shape[1] != c):
            raise ValueError(f"contexts must have shape ({n}, {c})")
        _check_context_ids(&self.model.m, contexts, "contexts")
        _check_ids(words, self.model.m.vocab_size, "words")
        cdef int32_t dummy = 0
        cdef const int32_t* base = &contexts[0, 0] if (n and c) else &dummy
        with nogil:
            for i in range(n):
                while k < ns and sentence_starts[k] == i:
                    nlm_session_begin(self.s, k)
                    k += 1
                total += nlm_score_padded(self.s, base + i * c, words[i])
        return total

    def stats(self) -> dict:
        """Counters: lookups, and hits/misses/clears of the context and class caches."""
        return {
            "lookups": self.s.lookups,
            "context_hits": self.s.ctx_cache.hits + self.s.ctx_memo.hits,
            "context_misses": self.s.ctx_cache.misses + self.s.ctx_memo.misses,
            "class_hits": self.s.class_cache.hits,
            "class_misses": self.s.class_cache.misses,
            "ngram_hits": self.s.ngram_cache.hits,
            "ngram_misses": self.s.ngram_cache.misses,
            "ngram_cache_enabled": bool(self.s.ngram_cache_enabled),
            "cache_clears": self.s.ctx_cache.clears + self.s.class_cache.clears,
            "cache_enabled": bool(self.s.cache_enabled),
            "context_cache_enabled": bool(self.s.ctx_cache_enabled),
            "context_memo_slots": int(self.s.ctx_memo.slots),
        }
