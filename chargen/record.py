"""The run record: a run or model folder's ``config.json``, read and written here alone.

Everything else sees a ``RunRecord``: typed, and checked on reading, since a folder may have
been hand-edited, truncated or made by someone else. A field of the wrong type, out of
range or missing is one line naming the field and the file. Format 1 is the only one so
far; ``FORMAT_VERSION`` goes up, with a migration in ``from_json``, when a field changes
meaning.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path

from .checks import TYPE_NAMES, check_field_types, check_finite, short
from .config import TrainConfig
from .errors import ChargenError
from .model import ModelConfig
from .modes import MODES, Mode, mode_of
from .storage import read_json, write_json

FORMAT = "chargen-run"
FORMAT_VERSION = 1
CONFIG = "config.json"
MAX_DEFAULT_PRIME = 1000


class FieldError(ChargenError):
    """A field of config.json that cannot be used; ``from_json`` adds the file's name."""


@dataclass(frozen=True)
class Summary:
    """Where the run stood at its last checkpoint (train.summary writes it)."""

    step: int = 0
    total_steps: int | None = 0  # (None: a timed plan stopped before it was fitted to the time)
    chars_seen: int = 0
    train_seconds: float = 0.0
    validation_seconds: float = 0.0
    best_val_loss: float | None = None
    best_val_bpc: float | None = None
    best_step: int | None = None  # (older runs lack it)

    def __post_init__(self) -> None:
        check_field_types(self)
        check_finite(self)


@dataclass(frozen=True)
class InitFrom:
    """A fine-tuned run's source (chargen.finetune)."""

    path: str
    weights: str
    weights_sha256: str
    new_chars: str = ""

    def __post_init__(self) -> None:
        check_field_types(self)
        check_finite(self)


@dataclass(frozen=True)
class Exported:
    """A model folder's origin (chargen export): the run's name and which weights."""

    source: str  # (written as "from")
    weights: str

    def __post_init__(self) -> None:
        check_field_types(self)
        check_finite(self)

    @classmethod
    def of(cls, part: dict) -> Exported:
        """From config.json's ``exported`` object, whose ``from`` is no name for a field."""
        for name in ("from", "weights"):
            if not isinstance(part.get(name), str):
                raise FieldError(f"{name} must be a string, not {short(part.get(name))}")
        return cls(part["from"], part["weights"])

    def to_json(self) -> dict:
        return {"from": self.source, "weights": self.weights}


@dataclass(frozen=True)
class CorpusInfo:
    """What the run was trained on, as ``chargen.corpus`` described it (``source``, kept
    whole for the record); the fields the rest of chargen reads, typed."""

    path: str
    chars: int = 0
    sha256: str = ""
    val_sha256: str | None = None
    val_fraction: float | None = None
    source: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_field_types(self)
        check_finite(self)

    @classmethod
    def of(cls, source: dict) -> CorpusInfo:
        known = {f.name for f in fields(cls)} - {"source"}
        return cls(**{k: v for k, v in source.items() if k in known}, source=dict(source))

    def to_json(self) -> dict:
        return self.source or {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}

    @property
    def shown(self) -> str:
        """The files' names without their folders: what a card or a page shows (an
        operator's or a server's folders are nobody else's business)."""
        return " ".join(Path(part).name for part in self.path.split()) or "?"

    @property
    def name(self) -> str:
        """The (first) file's name, without its folders (for a page or a card)."""
        return Path(self.path.split()[0] if self.path.split() else "?").name


@dataclass(frozen=True)
class RunRecord:
    mode: Mode
    model: ModelConfig
    train: TrainConfig
    corpus: CorpusInfo
    default_prime: str = ""
    parameters: int = 0
    precision_used: str | None = None
    chargen_version: str = ""
    lr_schedule: dict = field(default_factory=dict)
    summary: Summary = field(default_factory=Summary)
    init_from: InitFrom | None = None
    exported: Exported | None = None

    def to_json(self) -> dict:
        data = {"format": FORMAT, "format_version": FORMAT_VERSION, "chargen_version": self.chargen_version,
                "mode": self.mode.name, "model": self.model.to_dict(), "train": asdict(self.train),
                "corpus": self.corpus.to_json(),
                "default_prime": self.default_prime, "parameters": self.parameters,
                "precision_used": self.precision_used, "lr_schedule": self.lr_schedule,
                "summary": asdict(self.summary)}
        if self.init_from is not None:
            data["init_from"] = asdict(self.init_from)
        if self.exported is not None:
            data["exported"] = self.exported.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict, path: Path) -> RunRecord:
        """The record in ``data`` (config.json's object); a ChargenError naming the field
        and ``path`` for anything that cannot be used."""
        if data.get("format") != FORMAT:
            raise ChargenError(f"{path} is not a chargen run config (no \"format\": \"{FORMAT}\")")
        version = data.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ChargenError(f"{path} is corrupt: format_version must be a whole number, not {short(version)}")
        if version > FORMAT_VERSION:
            raise ChargenError(f"{path} was written by a newer chargen (format {version}); upgrade chargen")
        try:
            return cls._parse(data)
        except FieldError as e:
            raise ChargenError(f"{path}: {e}; fix or restore the file, or retrain") from None

    @classmethod
    def _parse(cls, data: dict) -> RunRecord:
        mode = data.get("mode", "stream")  # (a run from before modes is a stream)
        if not isinstance(mode, str) or mode not in MODES:
            raise FieldError(f"mode must be one of {', '.join(MODES)}, not {short(mode)}")
        model = section(ModelConfig, data, "model", required=MODEL_FIELDS)
        if model.vocab_size < 1:
            raise FieldError("model.vocab_size must be positive")
        record = cls(
            mode=mode_of(mode), model=model, train=section(TrainConfig, data, "train"),
            corpus=section(CorpusInfo, data, "corpus", CorpusInfo.of, required=("path",)),
            default_prime=value(data, "default_prime", str, ""), parameters=value(data, "parameters", int, 0),
            precision_used=value(data, "precision_used", str, None),
            chargen_version=value(data, "chargen_version", str, ""),
            lr_schedule=value(data, "lr_schedule", dict, {}),
            summary=section(Summary, data, "summary", default=Summary()),
            init_from=section(InitFrom, data, "init_from", default=None),
            exported=section(Exported, data, "exported", Exported.of, default=None))
        if record.parameters < 0:
            raise FieldError(f"parameters must be 0 or more, not {record.parameters}")
        if len(record.default_prime) > MAX_DEFAULT_PRIME:  # (fed at every sample's start: a long one is a long wait)
            raise FieldError(f"default_prime is {len(record.default_prime):,} characters; chargen writes one, and "
                             f"takes at most {MAX_DEFAULT_PRIME:,}")
        return record

    def with_summary(self, summary: Summary, lr_schedule: dict) -> RunRecord:
        return replace(self, summary=summary, lr_schedule=lr_schedule)


_REQUIRED = object()
MODEL_FIELDS = ("vocab_size", "embedding", "hidden", "layers")  # (a model's defaults are for new runs, not a record)


def value(data: dict, name: str, kind: type, default: object):
    """``data[name]`` if it is a ``kind`` (or null, where the default is), else ``default``
    when absent; a FieldError otherwise."""
    if name not in data or (data[name] is None and default is None):
        return default
    found = data[name]
    if not isinstance(found, kind) or (kind is int and isinstance(found, bool)):
        raise FieldError(f"{name} must be {TYPE_NAMES.get(kind, 'an object')}, not {short(found)}")
    return found


def section(cls: type, data: dict, name: str, make=None, default=_REQUIRED, required: tuple[str, ...] = ()):
    """The section ``name`` of ``data`` as a ``cls``: missing (without a default), not an
    object, lacking a field of ``required`` or one that ``cls`` needs, a field of the wrong
    type or out of range, and it is a FieldError naming it."""
    if data.get(name) is None:
        if default is _REQUIRED:
            raise FieldError(f"the {name} section is missing")
        return default
    part = data[name]
    if not isinstance(part, dict):
        raise FieldError(f"{name} must be an object, not {short(part)}")
    if make is None:  # (a ``make`` reads the part its own way)
        required = [*required, *(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)]
    if missing := [f for f in required if f not in part]:
        raise FieldError(f"{name} lacks {', '.join(missing)}")
    try:
        if make is not None:
            return make(part)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in part.items() if k in known})
    except ChargenError as e:
        raise FieldError(f"{name}: {e}") from None


def read_record(folder: Path) -> RunRecord:
    """The record of a run or model folder."""
    if not folder.is_dir():
        raise ChargenError(f"{folder}: no such run or model folder; train one with 'chargen train'")
    path = folder / CONFIG
    return RunRecord.from_json(read_json(path, folder, f"{path} is missing; is {folder} a chargen run folder?"), path)


def write_record(folder: Path, record: RunRecord) -> None:
    write_json(folder / CONFIG, record.to_json())
