"""nlmfeature: feed-forward neural language models for machine-translation decoders.

Load a model with :func:`load` and score with :meth:`Model.score_ngram`, :meth:`Model.score` (log10, as KenLM),
:meth:`Model.score_sentence` or :meth:`Model.perplexity`, or word by word from a
:class:`State` (:meth:`Model.begin_sentence`, :meth:`Model.score_word`).  Scores are natural logs.
"""
import os as _os

# Idle OpenMP threads of our kernels must not spin and starve OpenBLAS's threads (measured:
# training 10x slower with the default policy).  libgomp reads this when it loads, which is
# when the first extension module is imported below; a user's own setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# ...but a passive thread that sleeps at once pays a wake-up (tens of microseconds on a VM) at
# every parallel loop, and the fused training step runs several per minibatch: a short spin
# (about 0.1 ms) before sleeping made 2-thread training 1.5-1.7x faster than sleeping at once.
_os.environ.setdefault("GOMP_SPINCOUNT", "10000")

from nlmfeature.errors import InputError, ModelFileError, NLMFeatureError
from nlmfeature.core.model import Model, Perplexity, State, load, save
from nlmfeature.core.vocab import Vocabulary
from nlmfeature.core import joint as _joint  # noqa: E402,F401  (load() returns joint models)

__version__ = "0.1.0"
__all__ = ["load", "save", "Model", "Perplexity", "State", "Vocabulary", "NLMFeatureError",
           "ModelFileError", "InputError", "__version__"]
