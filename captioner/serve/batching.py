"""Dynamic batching: requests that arrive together are decoded together.

One worker thread runs the handler. It takes the oldest queued job, then more until it holds ``max_batch`` of
them, ``max_wait_s`` seconds have passed since that oldest job was submitted, or no job is queued and none is on
its way (a request announces itself on arrival, :meth:`DynamicBatcher.arrival`, so a lone request is decoded at
once). The jobs are grouped by key (checkpoint and beam size; different keys are never decoded together) and
each group is one call of ``handler(key, items)``, which returns one result per item, in order; every job's
future then gets its result and its :class:`Timing`. ``max_batch=1`` is plain one-at-a-time serving.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_STOP = object()


@dataclass(frozen=True)
class Timing:
    """Where a job's time went: waiting in the queue, then its group's decoding (shared with the group)."""

    queue_ms: float     # from submission to the start of its group's decoding
    decode_ms: float    # the group's decoding
    batch_size: int     # jobs decoded together in that group


class Arrival:
    """An announced request (:meth:`DynamicBatcher.arrival`), which submits at most one job."""

    def __init__(self, batcher: DynamicBatcher):
        self.batcher, self.submitted = batcher, False

    def submit_nowait(self, key: Hashable, item: Any) -> concurrent.futures.Future:
        """Queue the request's job; see :meth:`DynamicBatcher.submit_nowait`."""
        if self.submitted:
            raise RuntimeError("a request submits one job")
        future = self.batcher.submit_nowait(key, item, arrived=True)
        self.submitted = True
        return future

    async def submit(self, key: Hashable, item: Any) -> tuple[Any, Timing]:
        """Queue the request's job and wait for ``(result, Timing)`` without blocking the event loop."""
        return await asyncio.wrap_future(self.submit_nowait(key, item))


@dataclass
class _Job:
    key: Hashable
    item: Any
    submitted: float
    future: concurrent.futures.Future


class DynamicBatcher:
    """Collects jobs ``(key, item)`` and runs ``handler(key, items) -> results`` on groups of them in one
    worker thread; see the module docstring. Use :meth:`start` and :meth:`close` (or ``with``)."""

    def __init__(self, handler: Callable[[Hashable, Sequence[Any]], Sequence[Any]], *, max_batch: int = 16,
                 max_wait_s: float = 0.01):
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError(f"need max_batch >= 1 and max_wait_s >= 0, got {max_batch} and {max_wait_s}")
        self.handler, self.max_batch, self.max_wait_s = handler, max_batch, max_wait_s
        self._queue: collections.deque = collections.deque()
        self._arriving = 0      # requests announced (arrival) that have not submitted their job yet
        self._changed = threading.Condition()
        self._worker = threading.Thread(target=self._run, name="captioner-batcher", daemon=True)
        self._closed = False

    @property
    def queued(self) -> int:
        """Jobs waiting for the worker (not counting the group it is decoding)."""
        return len(self._queue)

    def start(self) -> DynamicBatcher:
        self._worker.start()
        return self

    def close(self) -> None:
        """Finish the jobs already taken, cancel the queued ones and stop the worker."""
        self._closed = True
        self._put(_STOP)
        if self._worker.is_alive():
            self._worker.join()
        while self._queue:
            job = self._queue.popleft()
            if job is not _STOP:
                job.future.cancel()

    def __enter__(self) -> DynamicBatcher:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def arrival(self) -> Iterator[Arrival]:
        """Announce a request that is going to submit a job (enter it before reading the request's upload):
        while it is on its way, a worker collecting a batch waits for it (up to ``max_wait_s``). Submit through
        the :class:`Arrival` yielded; a request that leaves without submitting (a refused upload) stops counting."""
        arrival = Arrival(self)
        with self._changed:
            self._arriving += 1
        try:
            yield arrival
        finally:
            if not arrival.submitted:
                self._arrived()

    def submit_nowait(self, key: Hashable, item: Any, *, arrived: bool = False) -> concurrent.futures.Future:
        """Queue one job; its future resolves to ``(result, Timing)`` or to the handler's exception. ``arrived``:
        the job of an announced request (see :meth:`arrival`), which stops counting as on its way."""
        if self._closed:
            raise RuntimeError("the batcher is closed")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._put(_Job(key, item, time.perf_counter(), future), arrived=arrived)
        return future

    def _put(self, job: _Job | object, arrived: bool = False) -> None:
        with self._changed:
            self._queue.append(job)
            self._arriving -= arrived
            self._changed.notify()

    def _arrived(self) -> None:
        with self._changed:
            self._arriving -= 1
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue)
                first = self._queue.popleft()
            if first is _STOP:
                return
            self._decode(self._collect(first))

    def _collect(self, first: _Job) -> list[_Job]:
        """``first`` and the jobs queued after it, up to ``max_batch``, waiting until ``max_wait_s`` after ``first``
        was submitted while announced requests are still on their way."""
        jobs, deadline = [first], first.submitted + self.max_wait_s
        with self._changed:
            while len(jobs) < self.max_batch:
                if not self._queue:
                    left = deadline - time.perf_counter()
                    if self._arriving <= 0 or left <= 0 or not self._changed.wait(left):
                        break
                    continue
                job = self._queue.popleft()
                if job is _STOP:
                    self._queue.appendleft(_STOP)      # decode what was collected, then stop
                    break
                jobs.append(job)
        return jobs

    def _decode(self, jobs: list[_Job]) -> None:
        """Run the handler once per key on the jobs still wanted (not cancelled); resolve their futures."""
        groups: dict[Hashable, list[_Job]] = {}
        for job in jobs:
            if job.future.set_running_or_notify_cancel():
                groups.setdefault(job.key, []).append(job)
        for key, group in groups.items():
            started = time.perf_counter()
            try:
                results = list(self.handler(key, [job.item for job in group]))
                if len(results) != len(group):
                    raise RuntimeError(f"the handler returned {len(results)} results for {len(group)} items")
            except Exception as error:  # the requests fail, the worker goes on
                log.exception("decoding a batch of %d for %r failed", len(group), key)
                for job in group:
                    job.future.set_exception(error)
                continue
            decode_ms = (time.perf_counter() - started) * 1000
            for job, result in zip(group, results):
                job.future.set_result((result, Timing(round((started - job.submitted) * 1000, 3),
                                                      round(decode_ms, 3), len(group))))
