"""Exceptions raised by nlmfeature.  Every message names the file (and line) at fault."""
from __future__ import annotations


class NLMFeatureError(Exception):
    """Base class of every error nlmfeature raises on purpose."""


class ModelFileError(NLMFeatureError):
    """A model file is missing, truncated, corrupted, of another version or inconsistent."""


class InputError(NLMFeatureError):
    """A user-supplied text, k-best list or configuration file is malformed."""

    def __init__(self, path: str, line: int, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")

    def __reduce__(self):  # so worker processes can send it back
        return (type(self), (self.path, self.line, self.message))


class DecoderError(NLMFeatureError):
    """A decoder (Moses, cdec) failed: non-zero exit or no output; the message says where its
    log is."""
