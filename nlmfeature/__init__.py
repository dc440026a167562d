"""nlmfeature: feed-forward neural language models for machine-translation decoders.

Load a model with :func:`load` and score with :meth:`Model.score`,
:meth:`Model.score_sentence` or :meth:`Model.perplexity`.  Scores are natural logs.
"""
from .errors import InputError, ModelFileError, NLMFeatureError
from .model import Model, Perplexity, load, save
from .vocab import Vocabulary

__version__ = "0.1.0"
__all__ = ["load", "save", "Model", "Perplexity", "Vocabulary", "NLMFeatureError",
           "ModelFileError", "InputError", "__version__"]
