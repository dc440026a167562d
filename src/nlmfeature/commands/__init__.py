"""Subcommands of the ``nlmfeature`` command line (see :mod:`nlmfeature.cli`)."""
