"""chargen: fast stateful character-level LSTMs: train on any text, sample from it."""

__version__ = "0.1.0"

from .api import TrainedModel, load  # noqa: E402
from .corpus import CorpusText, load_corpus  # noqa: E402
from .errors import ChargenError  # noqa: E402
from .model import ModelConfig  # noqa: E402
from .train import TrainConfig, TrainResult, train  # noqa: E402

__all__ = [
    "ChargenError",
    "CorpusText",
    "ModelConfig",
    "TrainConfig",
    "TrainResult",
    "TrainedModel",
    "__version__",
    "load",
    "load_corpus",
    "train",
]
