"""Resumable HTTP downloads with the standard library.

:func:`download` fetches a URL into ``NAME.part`` next to the destination and renames it to ``NAME`` only once
the body is complete (as long as the server's Content-Length says), so a file under its final name is always
whole. An interrupted download, whether the connection was cut mid-body or the process stopped, continues
from the bytes already on disk with an HTTP ``Range: bytes=N-`` request; a server that ignores the range
(200 instead of 206) is read again from the start. Connection failures and 5xx answers are retried with
exponential backoff (:data:`RETRIES` attempts in a row without a new byte); other HTTP errors (404, 403) stop
at once as a :class:`DownloadError`.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

from captioner.core.console import progress_bar
from captioner.errors import CaptionerError

log = logging.getLogger(__name__)

RETRIES = 5             # attempts in a row that bring no new byte before giving up
BACKOFF_S = 2.0         # wait before the k-th attempt in a row without progress: BACKOFF_S * 2 ** (k - 1)
TIMEOUT_S = 60.0        # socket timeout of the connection and of each read
CHUNK = 1 << 20         # bytes read and written at a time
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
USER_AGENT = "captioner (python urllib)"


class DownloadError(CaptionerError):
    """A download that cannot succeed: an HTTP error answer, or the connection failing attempt after attempt.
    ``reason`` is the short cause without the URL (``HTTP 404 Not Found``)."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"{url}: {reason}")
        self.url, self.reason = url, reason


class _Cut(Exception):
    """The connection ended before the body did (kept apart from other errors to resume at once)."""


def part_path(dest: str | Path) -> Path:
    """Where :func:`download` keeps the bytes of ``dest`` received so far."""
    dest = Path(dest)
    return dest.with_name(dest.name + ".part")


def _content_range_total(value: str | None) -> tuple[int | None, int | None]:
    """``(first byte, total size)`` of a ``Content-Range: bytes A-B/T`` (or ``bytes */T``) header."""
    match = re.fullmatch(r"bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)", (value or "").strip())
    if not match:
        return None, None
    first = int(match.group(1)) if match.group(1) is not None else None
    return first, (int(match.group(2)) if match.group(2) != "*" else None)


def download(url: str, dest: str | Path, *, progress: bool = True) -> Path:
    """Download ``url`` to ``dest`` (resumably, see the module docstring) and return ``dest``.

    ``dest`` already present is taken as complete (it only ever appears whole). ``progress``: a progress bar
    (:func:`~captioner.core.console.progress_bar`: on a terminal; elsewhere a line a minute). The body's length is checked
    against Content-Length (or Content-Range) when the server sends one. Raises :class:`DownloadError` naming the
    URL and the reason.
    """
    dest = Path(dest)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest)
    failures, restarted = 0, False
    furthest = part.stat().st_size if part.exists() else 0    # progress: the part file growing past this
    bar = None
    try:
        while True:
            offset = part.stat().st_size if part.exists() else 0
            request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
            if offset:
                request.add_header("Range", f"bytes={offset}-")
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                    total, append = _expected_total(response, offset, url)
                    if not append and offset:
                        log.info("%s: the server ignored the range; downloading it again from the start", url)
                        offset = 0
                    if bar is None:
                        bar = progress_bar(total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024,
                                           desc=dest.name, show=progress, leave=False)
                    else:
                        bar.reset(total=total)
                        bar.update(offset)
                    _copy_body(response, part, append, bar)
                    size = part.stat().st_size
                    if total is not None and size != total:
                        raise _Cut(f"{size:,} of {total:,} bytes received")
                os.replace(part, dest)
                return dest
            except urllib.error.HTTPError as err:
                if err.code == 416 and not restarted:  # the part file is longer than the remote file: start over
                    log.warning("%s: %s does not fit the remote file (HTTP 416); downloading it again", url, part)
                    part.unlink(missing_ok=True)
                    restarted, furthest = True, 0
                    continue
                if err.code not in RETRY_STATUS:
                    raise DownloadError(url, f"HTTP {err.code} {err.reason}") from None
                reason = f"HTTP {err.code} {err.reason}"
            except _Cut as err:
                reason = f"connection cut ({err})"
            except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
                reason = str(getattr(err, "reason", None) or err) or type(err).__name__
            failures, furthest = _after_failure(url, part, reason, failures, furthest)
    finally:
        if bar is not None:
            bar.close()


def _copy_body(response, part: Path, append: bool, bar) -> None:
    """The body of ``response`` appended to ``part`` (``append``) or written over it, CHUNK bytes at a time,
    counted on the progress ``bar``; raises :class:`_Cut` when the connection breaks off."""
    with part.open("ab" if append else "wb") as out:
        while True:
            try:
                block = response.read(CHUNK)
            except (http.client.IncompleteRead, OSError) as err:
                raise _Cut(str(err) or type(err).__name__) from None
            if not block:
                return
            out.write(block)
            bar.update(len(block))


def _after_failure(url: str, part: Path, reason: str, failures: int, furthest: int) -> tuple[int, int]:
    """``(failures in a row, furthest size of part)`` after an attempt failed for ``reason``: when ``part`` grew
    past ``furthest`` (progress), resume at once and the count of failures in a row starts again; else wait
    ``BACKOFF_S * 2**(failures - 1)`` s. Raises :class:`DownloadError` after ``RETRIES`` failures in a row."""
    size = part.stat().st_size if part.exists() else 0
    if size > furthest:
        log.warning("%s: %s, %s bytes in; resuming", url, reason, f"{size:,}")
        return 0, size
    failures += 1
    if failures >= RETRIES:
        raise DownloadError(url, f"{reason} ({failures} attempts in a row; run again to resume from "
                                 f"the {size:,} bytes in {part})")
    delay = BACKOFF_S * 2 ** (failures - 1)
    log.warning("%s: %s; retrying in %.0f s", url, reason, delay)
    time.sleep(delay)
    return failures, furthest


def _expected_total(response, offset: int, url: str) -> tuple[int | None, bool]:
    """``(total size or None, whether the body continues the part file)`` of a 200 or 206 answer."""
    length = response.headers.get("Content-Length")
    length = int(length) if length and length.isdigit() else None
    if response.status == 206:
        first, total = _content_range_total(response.headers.get("Content-Range"))
        if first != offset:
            raise DownloadError(url, f"the server answered a request for bytes {offset}- with "
                                     f"Content-Range {response.headers.get('Content-Range')!r}")
        return (total if total is not None else (offset + length if length is not None else None)), True
    return length, False
