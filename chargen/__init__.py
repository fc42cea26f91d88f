"""chargen: fast stateful character-level LSTMs: train on any text, sample from it."""

from .api import TrainedModel, load
from .config import TrainConfig
from .corpus import Corpus, load_corpus
from .errors import ChargenError
from .model import ModelConfig
from .train import TrainResult, train
from .version import __version__

__all__ = [
    "ChargenError",
    "Corpus",
    "ModelConfig",
    "TrainConfig",
    "TrainResult",
    "TrainedModel",
    "__version__",
    "load",
    "load_corpus",
    "train",
]
