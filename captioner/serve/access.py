"""Who may talk to ``captioner serve``, decided from a request's headers before its body is read.

* The ``Host`` header must be an IP address or one of the server's names (``localhost`` and ``--allow-host``):
  a web page whose own name was made to resolve to this machine (DNS rebinding) sends its own name, and is
  refused (400).
* A POST from a web page of another origin (its ``Origin`` header) is refused (403) unless ``--cors-origin``
  lets that origin in: a page the user visits cannot make the server decode what it sends.
* With a token (``--token``, or the ``CAPTIONER_TOKEN`` environment variable), every route but the page's own
  files needs ``Authorization: Bearer <token>`` (401 without).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from captioner.errors import CaptionerError
from captioner.serve.errors import error_response

LOCAL_NAMES = ("localhost",)
"""Host names every server answers to (IP addresses are always accepted)."""
TOKEN_VARIABLE = "CAPTIONER_TOKEN"
"""The environment variable ``captioner serve`` reads its token from when ``--token`` is not given."""


def host_name(host: str) -> str:
    """The name or address of a ``Host`` header, without its port or an IPv6 address's brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def check_token(token: str) -> str:
    """``token``, or :class:`~captioner.errors.CaptionerError` when it cannot be sent in a header (empty, spaces,
    characters other than printable ASCII)."""
    if not token or not all(33 <= ord(character) <= 126 for character in token):
        raise CaptionerError(f"the token (--token or {TOKEN_VARIABLE}) must be printable ASCII characters without "
                             "spaces, e.g. the output of: python -c 'import secrets; print(secrets.token_urlsafe())'")
    return token


def is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Access:
    """ASGI middleware refusing, before the body is read, the requests the module docstring describes:
    ``hosts`` are the names accepted besides :data:`LOCAL_NAMES` (``*`` any, ``*.example.org`` any name under
    it), ``cors_origins`` the origins of other sites whose POSTs are let in, ``token`` the bearer token every
    route but the page's own files needs (None: none)."""

    def __init__(self, app: ASGIApp, *, hosts: Sequence[str] = (), cors_origins: Sequence[str] = (),
                 token: str | None = None):
        self.app, self.hosts = app, [*LOCAL_NAMES, *(host.lower() for host in hosts)]
        self.cors_origins = {origin.rstrip("/").lower() for origin in cors_origins}
        self.token = None if token is None else token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self.refusal(scope)
        if refusal is not None:
            return await error_response(*refusal)(scope, receive, send)
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str, dict[str, str] | None] | None:
        """``(status, message, headers)`` of the refusal of a request, None when it may go on."""
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not self.host_allowed(host_name(host)):
            return 400, (f"unknown host {host[:200]!r}: this server answers to IP addresses and "
                         f"{', '.join(self.hosts)} (more with --allow-host)"), None
        origin = headers.get("origin")
        if scope["method"] not in ("GET", "HEAD", "OPTIONS") and origin is not None and not self.same_or_allowed(origin, host):
            return 403, f"cross-origin request from {origin[:200]} refused (let an origin in with --cors-origin)", None
        if self.token is not None and not self.public(scope["path"]):
            scheme, _, credentials = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(credentials.strip().encode(), self.token):
                return 401, ("this server needs its token: send the header 'Authorization: Bearer <token>' "
                             "(the page: open it with #token=<token> at the end of its address)"), \
                    {"WWW-Authenticate": "Bearer"}
        return None

    def same_or_allowed(self, origin: str, host: str) -> bool:
        """Whether a page of ``origin`` may POST to this server, reached as ``host``."""
        try:
            if urlsplit(origin).netloc.lower() == host.lower():
                return True
        except ValueError:      # not a URL (a broken IPv6 address)
            return False
        return origin.rstrip("/").lower() in self.cors_origins

    def host_allowed(self, name: str) -> bool:
        return is_ip_address(name) or any(
            pattern == "*" or name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:]))
            for pattern in self.hosts)

    @staticmethod
    def public(path: str) -> bool:
        """The page and its files, which carry no data: served without a token (the page asks for it)."""
        return path == "/" or path.startswith("/static/")
