"""The models of ``captioner serve`` in a process of their own, so that decoding never waits for the GIL.

Every PyTorch operator releases the GIL while it runs and takes it back after; a beam search runs thousands
of small operators, and in the server's process each of those hand-backs can wait for the event loop's
thread (HTTP parsing, JSON), which only yields the GIL every few milliseconds. Measured by
``benchmarks/bench_decode_beside_python.py``: beside one busy Python thread of the same process a batch
decodes hundreds of times slower than alone, beside a busy process about as fast. So the server's batcher
hands each batch to this child process over a pipe: the images go as one uint8 array, the captions come
back with their attention as arrays.

The child loads the checkpoints (:func:`~captioner.serve.checkpoints.load_served_models`) and decodes on the
server's device; the server's process holds only their descriptions (vocabulary, config, input transform,
grid: :meth:`~captioner.serve.checkpoints.ServedModel.description`), which the child sends once loaded, so the
weights sit in memory once and are read from disk once.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from captioner.decoding.search import Generation
from captioner.errors import CaptionerError
from captioner.serve.checkpoints import ServedModel, load_served_models

log = logging.getLogger(__name__)


@dataclass
class LoadSettings:
    """The arguments of :func:`~captioner.serve.checkpoints.load_served_models`, as the child receives them."""

    checkpoints: list[str]
    device: str
    overrides: list[str] = field(default_factory=list)
    beam: int | None = None
    max_pixels: int | None = None


class DecodingProcess:
    """A child process holding the served models; :meth:`caption` is a batcher handler
    ``(checkpoint name, beam), images -> n best captions of each``. Use :meth:`start` and :meth:`close`
    (or ``with``); once started, :attr:`models` describes the checkpoints it holds, by name, in the order
    given. One thread at a time may call :meth:`caption` (the batcher's worker)."""

    def __init__(self, settings: LoadSettings):
        context = multiprocessing.get_context("spawn")    # a fresh interpreter: no forked threads or CUDA state
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_child, args=(child, settings), name="captioner-decoder", daemon=True)
        self._child_end = child
        self.models: dict[str, ServedModel] = {}

    def start(self) -> DecodingProcess:
        """Start the child and wait until its models are loaded. If loading failed, raises the child's
        :class:`~captioner.errors.CaptionerError` (a bad checkpoint or override: one line for the user), or
        a RuntimeError with the child's error for anything else."""
        self._process.start()
        self._child_end.close()
        status, payload = self._receive()
        if status != "ready":
            self.close()
            if isinstance(payload, CaptionerError):
                raise payload
            raise RuntimeError(f"the decoding process could not load the models: {payload}")
        self.models = payload
        return self

    @property
    def alive(self) -> bool:
        """Whether the child is running (it ends only when closed, or killed)."""
        return self._process.is_alive()

    def caption(self, key: tuple[str, int], images: Sequence[torch.Tensor]) -> list[list[Generation]]:
        """The n best captions of each of ``images`` (each uint8 ``(3, H, W)``) by checkpoint ``key[0]`` with beam
        ``key[1]``, decoded in the child as one batch."""
        try:
            self._connection.send((key, torch.stack(list(images)).numpy()))
        except OSError:        # a broken pipe: the child is gone
            raise self._ended() from None
        status, payload = self._receive()
        if status != "ok":
            raise RuntimeError(f"decoding failed in the decoding process: {payload}")
        return [[_from_arrays(beam) for beam in beams] for beams in payload]

    def close(self) -> None:
        """Ask the child to stop and wait for it (terminate it after 10 s)."""
        if self._process.is_alive():
            try:
                self._connection.send(None)
            except OSError:
                pass
            self._process.join(10)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join()
        self._connection.close()

    def __enter__(self) -> DecodingProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _receive(self):
        try:
            return self._connection.recv()
        except EOFError:
            raise self._ended() from None

    def _ended(self) -> RuntimeError:
        self._process.join(1)
        return RuntimeError(f"the decoding process ended (exit code {self._process.exitcode})")


def _to_arrays(generation: Generation) -> tuple[list[int], float, dict[str, np.ndarray]]:
    """One beam's words, log-probability and attention as numpy arrays, which pickle in one piece (tensors
    through a multiprocessing pipe go as shared-memory handles, one per tensor)."""
    return generation.tokens, generation.log_prob, {name: values.numpy() for name, values in generation.attention.items()}


def _from_arrays(beam: tuple[list[int], float, dict[str, np.ndarray]]) -> Generation:
    tokens, log_prob, attention = beam
    return Generation(tokens, log_prob, {name: torch.from_numpy(values) for name, values in attention.items()})


def _child(connection, settings: LoadSettings) -> None:
    """The child's loop: load the models and send ``("ready", their descriptions)``, then answer
    ``(key, images)`` with ``("ok", captions)`` or ``("error", one line)`` until ``None`` or the parent is gone.
    Ctrl-C reaches the whole process group: the child leaves it to the parent, which stops it."""
    from captioner.utils import keep_freed_memory, resolve_device

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep_freed_memory()     # a spawned interpreter starts with glibc's defaults again: set up as the CLI does
    try:
        models = load_served_models(settings.checkpoints, resolve_device(settings.device), settings.overrides,
                                    beam=settings.beam, max_pixels=settings.max_pixels)
    except Exception as error:  # the parent reports it: a user's error as it is, anything else as a line
        connection.send(("error", error if isinstance(error, CaptionerError) else f"{type(error).__name__}: {error}"))
        return
    connection.send(("ready", {name: served.description() for name, served in models.items()}))
    while True:
        try:
            message = connection.recv()
        except EOFError:
            return
        if message is None:
            return
        (name, beam), images = message
        try:
            captions = models[name].caption(list(torch.from_numpy(images)), beam)
            connection.send(("ok", [[_to_arrays(generation) for generation in beams] for beams in captions]))
        except Exception as error:  # the batch's requests fail; the child goes on
            log.exception("decoding a batch of %d for %s failed", len(images), name)
            connection.send(("error", f"{type(error).__name__}: {error}"))
