"""Every refusal as a JSON ``{"error": "<one line>"}``, never a traceback: 4xx for the request's own faults
(unreadable images: the checks of ``captioner caption``; request fields FastAPI cannot validate, unknown paths,
uploads over the size limit: refused from the Content-Length header, or as soon as a streamed body passes it),
503 with ``Retry-After`` when the server cannot answer now (:class:`Unavailable`). Anything else is a bug: a
500 with a one-line message; its traceback goes to the server's log only."""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from captioner.errors import CaptionerError, ImageError

log = logging.getLogger(__name__)


class ApiError(Exception):
    """A refusal with its HTTP status (and headers), e.g. ``ApiError(404, "no checkpoint named 'x'")``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers


class Unavailable(ApiError):
    """503: the server cannot answer now (busy, or its decoding process restarting); ``Retry-After`` says
    when to try again, in whole seconds."""

    def __init__(self, message: str, retry_after_s: float = 1):
        super().__init__(503, message, {"Retry-After": str(max(1, math.ceil(retry_after_s)))})


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status_code=status, headers=headers)


def validation_message(errors: list[dict]) -> str:
    """FastAPI's validation errors in one line, e.g. ``missing form field 'image'; beam: Input should be ...``."""
    parts = []
    for error in errors:
        where = ".".join(str(part) for part in error["loc"] if part not in ("body", "query", "path"))
        parts.append(f"missing form field {where!r}" if error["type"] == "missing" else f"{where}: {error['msg']}")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    """Make every error of ``app`` a JSON ``{"error": ...}`` with the right status."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error_response(error.status, str(error), error.headers)

    @app.exception_handler(ImageError)
    async def unreadable_image(request: Request, error: ImageError) -> JSONResponse:
        return error_response(422, str(error))

    @app.exception_handler(CaptionerError)
    async def user_error(request: Request, error: CaptionerError) -> JSONResponse:
        return error_response(422, str(error))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(422, validation_message(error.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail), error.headers)

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=error)
        return error_response(500, f"internal error ({type(error).__name__}); the server's log has the details")


class UploadLimit:
    """ASGI middleware refusing request bodies over ``max_bytes`` with a 413 JSON error: at once when the
    Content-Length header says so (the body is never read), else when the bytes received pass the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes
        self.message = f"upload over the limit of {max_bytes / 2**20:g} MB (the server's --max-upload-mb)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await error_response(413, self.message)(scope, receive, send)
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise HTTPException(413, self.message)  # FastAPI passes it on from the body parser to http_error
            return message

        await self.app(scope, limited_receive, send)
