"""The models of ``captioner serve`` in a process of their own, so that decoding never waits for the GIL.

A beam search runs thousands of small PyTorch operators, each taking the GIL back as it ends; in the server's
process each can wait for the event loop's thread (HTTP parsing, JSON), which slows decoding badly
(``benchmarks/bench_decode_beside_python.py``). So the batcher hands each batch to this child process over a
pipe: the images as one uint8 array, the captions back with their attention as arrays.

The child loads the checkpoints (:func:`~captioner.serve.checkpoints.load_served_models`) and decodes on the
server's device; the server's process holds only their descriptions
(:meth:`~captioner.serve.checkpoints.ServedModel.description`), so the weights are in memory once. A child that
ends is replaced at once; meanwhile requests get a 503 saying when to try again.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from captioner.decoding.search import Generation
from captioner.errors import CaptionerError
from captioner.serve.checkpoints import ServedModel, load_served_models
from captioner.serve.errors import Unavailable

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
    ``(checkpoint name, beam), images -> n best captions of each``. Use :meth:`start` and :meth:`close` (or
    ``with``); :attr:`models` then describes the checkpoints by name, in order. One thread at a time may call
    :meth:`caption`.

    A child that ends is replaced at once; until the new one has loaded the models, batches fail with
    :class:`~captioner.serve.errors.Unavailable` (a 503). One that cannot load them is not tried again
    (:attr:`problem` says why)."""

    def __init__(self, settings: LoadSettings):
        self.settings = settings
        self._context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked threads or CUDA state
        self._lock = threading.Lock()       # the pipe: one exchange of caption(), or a child's replacement
        self._process = self._connection = None
        self._ready, self._closing, self._problem = False, False, "the decoding process has not started"
        self._supervisor = threading.Thread(target=self._supervise, name="captioner-decoder-supervisor", daemon=True)
        self.models: dict[str, ServedModel] = {}
        self.load_seconds = 0.0     # how long the last child took to load the models
        self.restarts = 0

    def start(self) -> DecodingProcess:
        """Start the child and wait until its models are loaded. If loading failed, raises the child's
        :class:`~captioner.errors.CaptionerError` (a bad checkpoint or override: one line for the user), or
        a RuntimeError with the child's error for anything else."""
        self.models = self._spawn()
        self._supervisor.start()
        return self

    @property
    def ready(self) -> bool:
        """Whether a child holds the models and takes batches."""
        return self._ready

    @property
    def problem(self) -> str | None:
        """Why no batch can be decoded now (None when :attr:`ready`)."""
        return None if self._ready else self._problem

    def caption(self, key: tuple[str, int], images: Sequence[torch.Tensor]) -> list[list[Generation]]:
        """The n best captions of each of ``images`` (each uint8 ``(3, H, W)``) by checkpoint ``key[0]`` with beam
        ``key[1]``, decoded in the child as one batch; :class:`~captioner.serve.errors.Unavailable` while no
        child is ready or when it ends while decoding them."""
        with self._lock:
            if not self._ready:
                raise Unavailable(self._problem, self.load_seconds)
            try:
                self._connection.send((key, torch.stack(list(images)).numpy()))
                status, payload = self._connection.recv()
            except (OSError, EOFError):      # a broken pipe: the child is gone (the supervisor reaps it)
                self._ready = False
                self._problem = "the decoding process ended while decoding this request's batch; it is restarting"
                raise Unavailable(self._problem, self.load_seconds) from None
        if status != "ok":
            raise RuntimeError(f"decoding failed in the decoding process: {payload}")
        return [[_from_arrays(beam) for beam in beams] for beams in payload]

    def close(self) -> None:
        """Stop the child (terminate it after 10 s) and the thread that replaces it."""
        self._closing = True
        with self._lock:
            self._ready, self._problem = False, "the server is stopping"
            process, connection = self._process, self._connection
        if process is not None:
            _stop(process, connection)
        if self._supervisor.is_alive():
            self._supervisor.join()

    def __enter__(self) -> DecodingProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _spawn(self) -> dict[str, ServedModel]:
        """Start a child and wait for its models: their descriptions; raises as :meth:`start` says."""
        connection, child_end = self._context.Pipe()
        process = self._context.Process(target=_child, args=(child_end, self.settings), name="captioner-decoder",
                                        daemon=True)
        started = time.perf_counter()
        process.start()
        child_end.close()
        with self._lock:
            self._process, self._connection = process, connection
        try:
            status, payload = connection.recv()
        except EOFError:
            process.join(1)
            status, payload = "error", f"it ended while loading the models (exit code {process.exitcode})"
        if status != "ready":
            _stop(process, connection)
            if isinstance(payload, CaptionerError):
                raise payload
            raise RuntimeError(f"the decoding process could not load the models: {payload}")
        self.load_seconds = time.perf_counter() - started
        with self._lock:
            self._ready, self._problem = True, None
        return payload

    def _supervise(self) -> None:
        """Replace the child whenever it ends, until :meth:`close` or a child that cannot load the models."""
        while not self._closing:
            multiprocessing.connection.wait([self._process.sentinel])
            if self._closing:
                return
            self._process.join()
            with self._lock:        # after the exchange in progress, which fails
                self._ready = False
                self._problem = f"the decoding process ended (exit code {self._process.exitcode}); it is restarting"
            self._connection.close()
            log.warning("%s", self._problem)
            try:
                self._spawn()
            except Exception as error:  # it stays down, and says why
                self._problem = f"the decoding process ended and could not be restarted: {error}"
                log.error("%s", self._problem)
                return
            self.restarts += 1
            log.warning("the decoding process was restarted (%.1f s)", self.load_seconds)
        _stop(self._process, self._connection)     # closed while a new child was loading


def _stop(process, connection) -> None:
    """Ask a child to stop and wait for it (terminate it after 10 s)."""
    if process.is_alive():
        try:
            connection.send(None)
        except OSError:
            pass
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join()
    connection.close()


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
    from captioner.core.devices import resolve_device
    from captioner.core.process import set_up_process

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_up_process()        # a spawned interpreter starts with the defaults again: set up as the CLI does
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
