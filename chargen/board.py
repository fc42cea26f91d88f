"""``--tensorboard``: a run's metrics and samples, mirrored to TensorBoard under RUN_DIR/tb
as they are written. ``metrics.jsonl`` stays the record; this is a view of it for those who
watch their runs in TensorBoard. The ``tensorboard`` package is an optional extra
(``pip install 'chargen[tensorboard]'``)."""

from __future__ import annotations

from pathlib import Path

from .errors import ChargenError

TB_DIR = "tb"
# The scalars of each kind of event, by their names in metrics.jsonl and in TensorBoard.
SCALARS = {"train": {"loss": "loss", "bpc": "bpc", "lr": "lr", "chars_per_s": "chars_per_s"},
           "val": {"val_loss": "loss", "val_bpc": "bpc"}}


def check_available() -> None:
    """A clear line, before the run starts, where TensorBoard's writer cannot be imported."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ChargenError("--tensorboard needs the tensorboard package: pip install 'chargen[tensorboard]' "
                           "(or pip install tensorboard), or drop --tensorboard") from None


class Board:
    """Writes events to ``RUN_DIR/tb``. A resumed run drops what an earlier process wrote past
    its checkpoint (``purge_step``), as the run itself went back there."""

    def __init__(self, run_dir: Path, purge_step: int | None = None) -> None:
        check_available()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / TB_DIR), purge_step=purge_step, flush_secs=10)

    def event(self, event: dict) -> None:
        """One event as ``Trainer.record`` writes it, or a validation's samples."""
        kind, step = event["event"], event["step"]
        for key, name in SCALARS.get(kind, {}).items():
            if key in event:
                self.writer.add_scalar(f"{kind}/{name}", event[key], step)
        if kind == "sample":  # (indented: TensorBoard shows text as Markdown)
            shown = "\n\n".join("    " + text.replace("\n", "\n    ") for text in event["texts"])
            self.writer.add_text("samples", shown, step)

    def close(self) -> None:
        self.writer.close()
