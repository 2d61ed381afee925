"""What ``captioner serve`` holds at once and how long it waits, whatever its clients send.

* :class:`Admission`: at most ``--max-queue`` caption and figure requests in the server at once, more get a
  503 with ``Retry-After`` before their upload is read; each answered within ``--timeout-s`` (408 when its
  upload had not arrived by then, 504 when the decoder had not answered);
* :class:`DecodeBudget`: uploads are decoded by a few threads of their own, each image once the memory its
  decoding may take, judged from its header (:func:`decode_cost`), fits in a fixed budget beside the images
  being decoded; the images themselves are decoded no larger than needed
  (:func:`~captioner.data.images.load_image_reduced`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from PIL import Image, PngImagePlugin
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from captioner.serve.batching import DynamicBatcher
from captioner.serve.errors import Unavailable, error_response

DECODE_THREADS = 4
"""Threads decoding uploads: at most this many images are decoded at once."""
DECODE_BUDGET = 2**30
"""Bytes that the images being decoded may take at once (an image that alone may take more decodes alone)."""
BYTES_PER_PIXEL = {"WEBP": 16}
"""Most memory a format's decoding takes per pixel (its decoder's buffers, the decoded image, a widened
copy of a palette or 16-bit image before it is reduced); other formats: :data:`DEFAULT_BYTES_PER_PIXEL`. Each
bounds what its decoder was measured to take per pixel (the CHANGELOG)."""
DEFAULT_BYTES_PER_PIXEL = 8
METADATA_BYTES = PngImagePlugin.MAX_TEXT_MEMORY
"""Most memory an image's metadata takes beside the file's own bytes: PIL's limit on a PNG's decompressed text."""
INFLATE_RATIO = 1032
"""The most bytes zlib inflates from one (a PNG's compressed text can take no more than this times its file)."""
GIVE_BACK_ABOVE = 128 * 2**20
"""A decoding that may take more bytes than this hands the memory it freed back to the system once done."""
BUSY_RETRY_AFTER_S = 1
"""``Retry-After`` of a 503 for a full queue."""
ARENA_BYTES = 64 * 2**20
"""What glibc may keep of the memory a decoding thread freed (the first heap of the thread's arena), trimmed or not."""
PEAK_ABOVE_IDLE = DECODE_BUDGET + DECODE_THREADS * ARENA_BYTES + 256 * 2**20
"""The stated ceiling of the server's resident memory (its processes together) above their size at rest, whatever
clients send: images being decoded, what glibc keeps of the decoding threads' memory, and 256 MiB for the rest
(requests in flight up to --max-queue, each with at most 1 MB of upload in memory, longer ones wait in temporary
files; connections and their heads; answers being written; the one figure being drawn)."""

ARRIVAL = "captioner.arrival"
"""The ASGI scope key of a decoding request's :class:`~captioner.serve.batching.Arrival`."""
DECODING_ROUTES = ("/api/caption", "/api/figure")


def image_header(file: BinaryIO) -> tuple[tuple[int, int], str] | None:
    """The ``(width, height)`` and format an image file's header states (only the header is read), or None
    where PIL cannot open it; the file is left at its start."""
    try:
        with Image.open(file) as image:
            return image.size, image.format
    except Exception:  # whatever fails here fails again, with its message, when the image is decoded
        return None
    finally:
        file.seek(0)


def decode_cost(header: tuple[tuple[int, int], str] | None, file_bytes: int) -> int:
    """An upper bound of the memory decoding an image takes (:func:`image_header`'s ``header``, None: one
    that will be refused before any pixel is decoded): its pixels at :data:`BYTES_PER_PIXEL`, its metadata
    (:data:`METADATA_BYTES`, at most :data:`INFLATE_RATIO` times the file) and the file's bytes."""
    pixels = 0
    if header is not None:
        (width, height), image_format = header
        pixels = width * height * BYTES_PER_PIXEL.get(image_format, DEFAULT_BYTES_PER_PIXEL)
    return pixels + min(METADATA_BYTES, INFLATE_RATIO * file_bytes) + file_bytes


class DecodeBudget:
    """Runs functions in :data:`DECODE_THREADS` threads of its own, each once its stated cost in bytes fits in
    ``budget`` beside the costs of those running (a cost over the whole budget waits until nothing runs).
    The bytes stay reserved until the function returns, even when its caller stopped waiting (a deadline).
    Used from one event loop; :meth:`close` stops the threads."""

    def __init__(self, budget: int = DECODE_BUDGET, threads: int = DECODE_THREADS):
        self.budget, self.reserved = budget, 0
        self._executor = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="captioner-decode")
        self._waiters: list[asyncio.Future] = []

    async def run(self, cost: int, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in one of the threads, once ``cost`` bytes are free; its result."""
        cost = min(cost, self.budget)
        loop = asyncio.get_running_loop()
        while self.reserved + cost > self.budget:
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        self.reserved += cost
        work = (_giving_back, function, *args) if cost > GIVE_BACK_ABOVE else (function, *args)
        try:
            future = self._executor.submit(*work)
        except BaseException:
            self._release(cost)
            raise
        future.add_done_callback(lambda _: self._release_from(loop, cost))
        return await asyncio.wrap_future(future)

    def _release_from(self, loop: asyncio.AbstractEventLoop, cost: int) -> None:
        """Release ``cost`` in the event loop (called in the thread that ran the function)."""
        with contextlib.suppress(RuntimeError):     # the loop has closed: nothing waits any more
            loop.call_soon_threadsafe(self._release, cost)

    def _release(self, cost: int) -> None:
        self.reserved -= cost
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _giving_back(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, then the memory freed meanwhile handed back to the system (glibc's ``malloc_trim``):
    the command line has glibc keep freed memory for reuse (:func:`captioner.core.memory.keep_freed_memory`), which
    would leave the server's process as large as its largest decodings for good."""
    try:
        return function(*args)
    finally:
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc only
    except (OSError, AttributeError):
        return None
    return libc.malloc_trim


_MALLOC_TRIM = _malloc_trim()


@dataclass
class InFlight:
    """The decoding requests in the server (from their headers to their answer): ``count``, at most ``limit``."""

    limit: int
    count: int = 0


class Admission:
    """ASGI middleware in front of the decoding routes (POST /api/caption, /api/figure). Before its upload is
    read, a request is refused with a 503 (and ``Retry-After``) while ``in_flight`` is at its limit or while
    ``unavailable()`` gives a reason (and seconds to wait); one let in is announced to the batcher
    (:meth:`DynamicBatcher.arrival`) and answered within ``timeout_s`` of its headers, else a 408 (upload
    incomplete) or a 504."""

    def __init__(self, app: ASGIApp, batcher: DynamicBatcher, *, in_flight: InFlight, timeout_s: float,
                 unavailable: Callable[[], tuple[str, float] | None] = lambda: None):
        self.app, self.batcher, self.in_flight, self.timeout_s = app, batcher, in_flight, timeout_s
        self.unavailable = unavailable

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in DECODING_ROUTES:
            return await self.app(scope, receive, send)
        down = self.unavailable()
        if down is not None:
            return await _unavailable(*down)(scope, receive, send)
        if self.in_flight.count >= self.in_flight.limit:
            return await _unavailable(f"the server is busy: {self.in_flight.count} requests in it, its --max-queue; "
                                      "try again shortly", BUSY_RETRY_AFTER_S)(scope, receive, send)
        self.in_flight.count += 1
        received = started = False

        async def tracked_receive() -> Message:
            nonlocal received
            message = await receive()
            received = received or message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            with self.batcher.arrival() as arrival:
                await asyncio.wait_for(self.app({**scope, ARRIVAL: arrival}, tracked_receive, tracked_send),
                                       self.timeout_s)
        except asyncio.TimeoutError:
            if started:     # the answer was on its way to a client reading it too slowly: the connection closes
                return
            late = (f"no answer within {self.timeout_s:g} s (the server's --timeout-s): it is busy, try again later"
                    if received else f"the upload did not arrive within {self.timeout_s:g} s (the server's "
                                     "--timeout-s)")
            await error_response(504 if received else 408, late, None if received else {"Connection": "close"})(
                scope, receive, send)
        finally:
            self.in_flight.count -= 1


def _unavailable(message: str, retry_after_s: float):
    refusal = Unavailable(message, retry_after_s)
    return error_response(refusal.status, str(refusal), refusal.headers)

