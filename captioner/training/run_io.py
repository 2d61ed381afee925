"""What a training run writes and listens to besides its checkpoints: the metrics log (``metrics.jsonl``,
mirrored to wandb) and the stop signals (SIGINT, SIGTERM) that end it with a resumable checkpoint."""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from captioner.core.files import write_file

if TYPE_CHECKING:
    from captioner.config import Config

log = logging.getLogger(__name__)


class MetricsLogger:
    """Appends one JSON object per record to ``metrics.jsonl`` and mirrors it to wandb when ``train.wandb`` is
    not ``disabled`` (project, entity and tags from ``train.wandb_*``); silent where ``enabled`` is false (ranks
    other than 0). The W&B run id is kept in the run folder (``wandb_run_id``), so that a resumed run goes on
    logging to the same W&B run."""

    ID_FILE = "wandb_run_id"

    def __init__(self, run_dir: Path, config: Config, resume: bool = False, enabled: bool = True):
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        if enabled:
            self._drop_partial_last_line()
        self.wandb = None
        train = config.train
        if enabled and train.wandb != "disabled":
            import wandb  # imported only when used: it takes seconds and starts background threads

            os.environ.setdefault("WANDB_SILENT", "true")
            id_file = run_dir / self.ID_FILE
            run_id = id_file.read_text().strip() if resume and id_file.exists() else None
            if run_id is None:
                run_id = secrets.token_hex(4)
                write_file(id_file, run_id + "\n")
            self.wandb = wandb.init(project=train.wandb_project, entity=train.wandb_entity,
                                    tags=list(train.wandb_tags), dir=str(run_dir), config=config.to_dict(),
                                    mode=train.wandb, name=run_dir.name, id=run_id, resume="allow",
                                    reinit="finish_previous")

    def _drop_partial_last_line(self) -> None:
        """A run killed while writing a record (or stopped by a full disk) leaves a line without its newline;
        a resumed run would write its first record onto it. Cut it off."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("r+b") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) == b"\n":      # the usual case: a whole log is not read at every start
                return
            handle.seek(0)
            data = handle.read()
            keep = data.rfind(b"\n") + 1
            log.warning("%s: dropped a partial last line (%d bytes) left by a run that stopped while writing it",
                        self.path, len(data) - keep)
            handle.truncate(keep)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=record.get("step"))

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


class GracefulStop:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps, so a checkpoint can be saved."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        if self.requested:  # a second signal: stop at once
            raise KeyboardInterrupt
        self.requested = True
        log.warning("stop requested (%s): saving a resumable checkpoint after this step", signal.Signals(signum).name)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
