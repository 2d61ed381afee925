"""The connections of ``captioner serve``: uvicorn's HTTP protocol (httptools) with the limits that a server
facing clients it does not trust needs and uvicorn leaves out. Left to itself, uvicorn waits forever for a
request's head (its request line and headers) and buffers heads of any size (a 10 MB URL is 10 MB of the
server's memory), keeps a connection open for as long as the body of a request it already answered trickles
in, and parses every request a client pipelines in one go (thousands from one read of 256 kB)."""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

HEAD_TIMEOUT_S = 10.0
"""A request's head must arrive within this many seconds (from the connection, or from its first byte after
the previous answer); the body of a request answered before it arrived is dropped for as long, at most."""
MAX_HEAD_BYTES = 32 * 1024
"""Largest request head (request line and headers; browsers send a few kB)."""
MAX_PIPELINED = 16
"""Most requests waiting on one connection behind the one being answered."""
MAX_CONNECTIONS = 512
"""Most connections at once; one more is answered 503 and closed."""


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol under the limits above: a head too slow gets a 408, too large a 431, a
    connection past :data:`MAX_CONNECTIONS` a 503, a client pipelining past :data:`MAX_PIPELINED` a 400, as does
    a request that is not valid HTTP; each a JSON ``{"error": ...}``, after which the connection closes. Pass it to
    ``uvicorn.Config(http=GuardedHttp)``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._awaiting_head, self._in_body, self._head_bytes = True, False, 0
        self._timer: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str] | None = None
        self._dropping = False      # refused: what the client still sends is dropped
        self._running = None        # the cycle being answered (self.cycle is the last one parsed)
        if len(self.connections) > MAX_CONNECTIONS:
            self._refuse(503, f"the server holds {MAX_CONNECTIONS} connections, its most; try again shortly",
                         b"retry-after: 1\r\n", linger=False)
        else:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._dropping:
            return
        if self._awaiting_head:
            self._head_bytes += len(data)
            self._arm()
        super().data_received(data)
        if self._awaiting_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._refuse(431, f"request head over {MAX_HEAD_BYTES // 1024} kB")

    def on_headers_complete(self) -> None:
        self._awaiting_head, self._in_body, self._head_bytes = False, True, 0
        self._disarm()
        if len(self.url) + sum(len(name) + len(value) for name, value in self.headers) > MAX_HEAD_BYTES:
            self._refusal = (431, f"request head over {MAX_HEAD_BYTES // 1024} kB")
        elif len(self.pipeline) >= MAX_PIPELINED:
            self._refusal = (400, f"over {MAX_PIPELINED} requests pipelined on one connection")
        if self._refusal:       # stops the parser: uvicorn then answers an invalid request (send_400_response)
            raise RuntimeError(self._refusal[1])
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        self._refuse(*(self._refusal or (400, f"invalid HTTP request ({msg.rstrip('.')})")))

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_head, self._in_body = True, False
        self._disarm()
        if self.cycle is not None and self.cycle.response_complete:    # answered early: now it may idle
            self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._in_body:           # answered before its body arrived (refused): drop the rest, for a while
            self._arm()

    def _start_asgi_task(self, cycle, app) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(HEAD_TIMEOUT_S, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if not self._dropping and self._awaiting_head and self._head_bytes and (
                self.cycle is None or self.cycle.response_complete):
            self._refuse(408, f"the request head did not arrive within {HEAD_TIMEOUT_S:g} s")
        else:
            self.transport.close()

    def _refuse(self, status: int, message: str, headers: bytes = b"", linger: bool = True) -> None:
        """Answer ``status`` with ``{"error": message}`` in place of any answer in progress, and close the
        connection; ``linger``: only once the client has stopped sending, or :data:`HEAD_TIMEOUT_S` have passed
        (what it sends meanwhile is dropped: closing on unread data would reset the connection, and the client
        could lose the answer)."""
        cycles = [self._running, self.cycle] + [cycle for cycle, _ in self.pipeline]
        self.pipeline.clear()
        for cycle in cycles:        # the answers in progress and queued go nowhere
            if cycle is not None:
                cycle.disconnected = True
                cycle.message_event.set()
        body = json.dumps({"error": message}).encode()
        self.transport.write(STATUS_LINE[status] + b"content-type: application/json\r\ncontent-length: "
                             + str(len(body)).encode() + b"\r\nconnection: close\r\n" + headers + b"\r\n" + body)
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self._dropping = True
            self._disarm()
            self._arm()
        else:
            self.transport.close()
