"""What a run prints: the log line format and progress bars that fit where they go (redrawn on a
terminal, a plain line a minute in a log file)."""

from __future__ import annotations

import sys

from tqdm import tqdm

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"    # the log lines of every command and demo worker


PROGRESS_LINE_S = 60.0
"""How often a progress bar that is not on a terminal writes a line (:func:`progress_bar`)."""


class ProgressLines(tqdm):
    """A tqdm bar for a stream that is not a terminal (a log file, CI, ``nohup``): instead of redrawing itself with a
    carriage return at every update, it writes its state as a line of its own at most every ``mininterval``
    seconds, and nothing when it closes."""

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        now = self._time()
        if msg is None and self.n != self.initial and now - getattr(self, "line_at", self.start_t) >= self.mininterval:
            self.line_at = now
            self.fp.write(self.__str__() + "\n")
            self.fp.flush()
        return False        # nothing drawn in place, so nothing to clear


def progress_bar(iterable=None, *, show: bool = True, file=None, **options) -> tqdm:
    """A tqdm progress bar over ``iterable`` (``options`` as tqdm's) on ``file`` (default: stderr) when ``show``.
    On a terminal it redraws itself in place; elsewhere (a log file, CI, ``nohup``) it writes no per-batch update,
    only a plain line every :data:`PROGRESS_LINE_S` seconds (or ``mininterval``; :class:`ProgressLines`)."""
    file = file or sys.stderr
    if not show or getattr(file, "isatty", lambda: False)():
        return tqdm(iterable, file=file, disable=not show, **options)
    options = {"mininterval": PROGRESS_LINE_S, **options, "leave": False,
               "bar_format": "{desc}: {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"}
    return ProgressLines(iterable, file=file, **options)
