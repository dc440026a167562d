"""Subcommands of the ``nlmfeature`` command line (see :mod:`nlmfeature.cli`).

Flag conventions of every command: ``-i/--input`` what is read, ``-o/--output`` what is
written, ``-r/--ref`` references, ``-m/--model`` an input model (``eval -m`` is sacrebleu's
``--metrics``), ``--threads`` the same default everywhere (:data:`DEFAULT_THREADS`).  Older
spellings (``--out``, ``--model-out``, ``--text``, ``--test``, ``--output-1best``) stay as
aliases."""

#: the default of every command's ``--threads``
DEFAULT_THREADS = 2
