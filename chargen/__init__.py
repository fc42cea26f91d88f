"""chargen: fast stateful character-level LSTMs: train on any text, sample from it."""

__version__ = "0.1.0"

from .api import TrainedModel, load
from .corpus import Corpus, load_corpus
from .errors import ChargenError
from .model import ModelConfig
from .train import TrainConfig, TrainResult, train

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
