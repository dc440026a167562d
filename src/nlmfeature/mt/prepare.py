"""Raw text to the tokenised, lowercased text Moses systems are trained on
(the work of ``nlmfeature prepare``; its flags are :mod:`nlmfeature.commands.prepare`'s).

The Moses pipeline ``normalize-punctuation.perl -l L | tokenizer.perl -a -l L | lowercase.perl``
(then ``clean-corpus-n.perl``'s white-space clean-up), done with sacremoses so no Perl is needed.
sacremoses 0.2.0 differs from the Perl scripts in two places, both handled here so that the
output is identical on Multi30k (dev, test2016 and the 29,000 training pairs, de and en; see
``tests/test_prepare.py``):

- ``tokenizer.perl`` always splits the period off the *last* word of a line ("... linie a." →
  "linie a ."), sacremoses only when the word is not a non-breaking prefix (single letters,
  German ordinals like "28.", "St."): :class:`_PerlTokenizer` restores the Perl rule;
- ``normalize-punctuation.perl`` sees each line *with* its newline, so its German/Spanish/French
  rule ``s/(\\.+)\\"(\\s*[^<])/\\"$1$2/`` also moves a period behind a closing quote at the end of
  a line ("tea.\\"" → "tea\\"."); sacremoses sees the line without it.  The normaliser is given
  the newline too.

``perl_parity=True`` of sacremoses' normaliser supplies the third difference (a ’ that is not
between letters becomes ``"``, as in the Perl script).  The escaping of ``& < > ' " [ ] |`` is
the Perl tokenizer's default (``'`` → ``&apos;``), as Moses phrase tables expect.
"""
from __future__ import annotations

import argparse
import re
from typing import Iterable, Iterator

from nlmfeature.errors import NLMFeatureError
from nlmfeature.io.textio import split_tokens

_WS = re.compile(r"\s+")
_LAST_WORD = re.compile(r"\S+\.")


def _sacremoses():
    try:
        import sacremoses
    except ImportError:   # pragma: no cover - a declared dependency
        raise NLMFeatureError("nlmfeature prepare needs sacremoses (pip install sacremoses)") from None
    return sacremoses


class Preparer:
    """Moses-compatible text preparation of one language (see the module doc).

    ``lang`` is a two-letter code (``en``, ``de``, ``fr``, ...); ``aggressive`` splits hyphens
    between letters/digits as ``tokenizer.perl -a`` (``t-shirt`` → ``t @-@ shirt``);
    ``lowercase`` lowercases as ``lowercase.perl``; ``escape`` escapes XML/Moses special
    characters as ``tokenizer.perl`` does by default.
    """

    def __init__(self, lang: str = "en", aggressive: bool = True, lowercase: bool = True,
                 escape: bool = True, normalise: bool = True) -> None:
        if not isinstance(lang, str) or not re.fullmatch(r"[a-z]{2,3}", lang):
            raise NLMFeatureError(f"language must be a two- or three-letter code like 'en', "
                                  f"not {lang!r}")
        for name, value in (("aggressive", aggressive), ("lowercase", lowercase),
                            ("escape", escape), ("normalise", normalise)):
            if not isinstance(value, bool):
                raise TypeError(f"Preparer: {name} must be a bool, not {type(value).__name__}")
        sm = _sacremoses()
        self.lang = lang
        self.aggressive = aggressive
        self.lowercase = lowercase
        self.escape = escape
        self.normaliser = sm.MosesPunctNormalizer(lang=lang, perl_parity=True) if normalise else None
        self.tokenizer = _perl_tokenizer_class(sm)(lang=lang)

    def __call__(self, line: str) -> str:
        """The prepared form of one line (no newline; white space collapsed)."""
        if not isinstance(line, str):
            raise TypeError(f"Preparer: a line must be a str, not {type(line).__name__}")
        text = line.replace("\r", "")
        if self.normaliser is not None:
            # the Perl script sees the newline (see the module doc); sacremoses strips it again
            text = self.normaliser.normalize(text + "\n")
        text = self.tokenizer.tokenize(text, aggressive_dash_splits=self.aggressive,
                                       escape=self.escape, return_str=True)
        if self.lowercase:
            text = text.lower()
        return " ".join(_WS.split(text.strip())) if text.strip() else ""

    def lines(self, lines: Iterable[str]) -> Iterator[str]:
        """Prepare many lines lazily."""
        for line in lines:
            yield self(line)


_TOKENIZER_CLASS = None


def _perl_tokenizer_class(sm):
    """sacremoses' MosesTokenizer with tokenizer.perl's last-word rule (module doc)."""
    global _TOKENIZER_CLASS
    if _TOKENIZER_CLASS is None:
        class _PerlTokenizer(sm.MosesTokenizer):
            def handles_nonbreaking_prefixes(self, text: str) -> str:
                tokens = super().handles_nonbreaking_prefixes(text).split(" ")
                # tokenizer.perl: "split last words independently as they are unlikely to be
                # non-breaking prefixes" (a split last word ends in a lone ".")
                if tokens and _LAST_WORD.fullmatch(tokens[-1]):
                    tokens[-1] = tokens[-1][:-1] + " ."
                return " ".join(tokens)

        _TOKENIZER_CLASS = _PerlTokenizer
    return _TOKENIZER_CLASS


def detokenise(lines: Iterable[str], lang: str = "en") -> Iterator[str]:
    """Moses-detokenised lines (sacremoses; undoes ``@-@`` splits and the escaping)."""
    md = _sacremoses().MosesDetokenizer(lang=lang)
    for line in lines:
        yield md.detokenize(split_tokens(line), unescape=True)


# -- command line ------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    from nlmfeature.io.atomicfile import check_output, open_output
    from nlmfeature.io.textio import iter_lines

    check_output(args.output, "output", stream=True)
    lines = (line for _, line in iter_lines(args.input))
    if args.detokenise:
        out: Iterator[str] = detokenise(lines, args.lang)
    else:
        prep = Preparer(args.lang, aggressive=not args.no_aggressive,
                        lowercase=not args.no_lowercase, escape=not args.no_escape,
                        normalise=not args.no_normalise)
        out = prep.lines(lines)
    with open_output(args.output) as f:
        for line in out:
            f.write(line + "\n")
    return 0

