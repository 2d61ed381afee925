"""How every captioner process starts: denormals flushed to zero and freed memory kept for reuse."""

from __future__ import annotations

from captioner.core.floats import flush_denormals
from captioner.core.memory import keep_freed_memory


def set_up_process() -> dict[str, bool]:
    """Set up this process as every ``captioner`` command runs: denormal floats flushed to zero
    (:func:`~captioner.core.floats.flush_denormals`) and freed memory kept by glibc for reuse
    (:func:`~captioner.core.memory.keep_freed_memory`).

    Call it first, before torch starts its threads (the denormal flag reaches only threads started after it): the
    command line, the demo's and the server's child processes and the scripts that train or score in their own
    process do, so that a time a script measures is the time ``captioner train`` takes. Returns whether each took."""
    return {"flush_denormals": flush_denormals(), "keep_freed_memory": keep_freed_memory()}
