"""``captioner serve`` under hostile clients (issue #30), printed as JSON.

A live server (``python -m captioner serve --checkpoint CKPT --port 0``: its default limits, one torch thread, on
127.0.0.1 only) answers ``--requests`` legitimate caption requests (shapes images) from 16 clients twice: alone, then
while 16 hostile clients (a process of their own) run a battery in a loop: uploads of a 60-megapixel PNG, its
WebP and 16-bit kin and a header claiming 40,000 x 40,000 pixels, the 4096-pixel overlay probe, foreign Host
and Origin headers, heads and uploads that stall until the server cuts them off, a 1 MB head, 2,000 requests
pipelined in one write, bursts of tiny requests, Content-Lengths and multipart bodies that lie, a 25 MB upload
streamed without a length. Per phase: the legitimate requests' statuses (any 5xx but a declared 503 is a
failure), their latency (p50/p95/p99) and images/s; the hostile probes' outcomes; the server's resident memory
(both processes, sampled every 20 ms) at rest and at its peak, against its stated ceiling
(:data:`captioner.serve.limits.PEAK_ABOVE_IDLE`). Every phase stops by itself: bounded counts, and
``--time-limit`` seconds at most.

The checkpoint: ``--checkpoint PATH``, by default the demo's trained soft-attention model
(``runs/demo/soft/best.pt``), else that model with random weights (captions that end at once).

    python benchmarks/bench_serve_soak.py [--quick] [--threads N] [--device auto] [--checkpoint CKPT]
                                          [--requests N] [--time-limit S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import multiprocessing
import os
import random
import re
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from bench_serve import DEMO_SOFT, ROOT, live_server, random_demo_checkpoint, rss_mb
from common import add_arguments
from captioner.results.record import report
from PIL import Image

from captioner.data.shapes import generate_shapes
from captioner.serve.limits import PEAK_ABOVE_IDLE

CLIENTS = 16
HOSTILE_CLIENTS = 16
BIG_SIDE = 7746         # 60 megapixels, under the default limit of 64


def hostile_payloads() -> dict[str, bytes]:
    """The battery's images: 60 megapixels of one colour as PNG (190 kB), lossless WebP and 16-bit PNG, and a
    PNG whose header claims 40,000 x 40,000 pixels."""
    def encoded(image: Image.Image, image_format: str, **options) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, image_format, **options)
        return buffer.getvalue()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    colour = Image.new("RGB", (BIG_SIDE, BIG_SIDE), (120, 30, 200))
    claimed = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 40000, 40000, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")
    return {"png": encoded(colour, "PNG"), "webp": encoded(colour, "WEBP", lossless=True),
            "png16": encoded(Image.new("I;16", (BIG_SIDE, BIG_SIDE), 1000), "PNG"), "bomb": claimed}


def multipart(*parts: tuple[str, bytes], boundary: str = "b") -> tuple[bytes, str]:
    body = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
                    f"Content-Type: image/png\r\n\r\n".encode() + data + b"\r\n" for name, data in parts)
    return body + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


async def raw(port: int, data: bytes, *, stall: bool = False) -> str:
    """Send ``data`` on a connection of its own (``stall``: then nothing more, without closing); the statuses
    the server answers before it closes (``200+400``), or how the connection ended."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        with contextlib.suppress(OSError):     # the server may answer and close before it has all
            writer.write(data)
            await writer.drain()
            if not stall:
                writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 120)
    except (OSError, asyncio.TimeoutError) as error:
        return type(error).__name__
    finally:
        writer.close()
    return "+".join(sorted(set(re.findall(r"^HTTP/1\.1 (\d{3}) ", answer.decode("latin-1"), re.MULTILINE)))) or "closed"


def head(method: str, path: str, *lines: str) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", *lines, "", ""]).encode()


async def probe(name: str, http: httpx.AsyncClient, port: int, payloads: dict[str, bytes], small: bytes) -> str:
    """One probe of the battery: its outcome (the status, or how the connection ended)."""
    host = "Host: 127.0.0.1"
    if name in ("png", "webp", "png16", "bomb"):
        return str((await http.post("/api/caption", files={"image": (f"{name}.img", payloads[name])})).status_code)
    if name == "overlay_4096":
        return str((await http.get("/api/overlay-operators", params={"grid_height": 4096, "grid_width": 4096,
                                                                     "height": 4096, "width": 4096})).status_code)
    if name == "foreign_host":
        return str((await http.get("/api/models", headers={"Host": "evil.example"})).status_code)
    if name == "cross_origin_post":
        return str((await http.post("/api/caption", files={"image": ("a.png", small)},
                                    headers={"Origin": "http://evil.example"})).status_code)
    if name == "slow_head":
        return await raw(port, b"POST /api/caption HTTP/1.1\r\nHost: 127.0.0", stall=True)
    if name == "slow_upload":
        body, kind = multipart(("a.png", small))
        return await raw(port, head("POST", "/api/caption", host, f"Content-Type: {kind}", "Content-Length: 100000")
                         + body[:200], stall=True)
    if name == "lying_length":
        body, kind = multipart(("a.png", small))
        return await raw(port, head("POST", "/api/caption", host, f"Content-Type: {kind}", "Content-Length: 10") + body)
    if name == "huge_head":
        return await raw(port, head("GET", "/api/models", host, "X-Padding: " + "p" * 2**20))
    if name == "pipelined_2000":
        return await raw(port, head("GET", "/health", host) * 2000)
    if name == "tiny_requests":
        answers = Counter([(await http.get("/health")).status_code for _ in range(200)])
        return "200x200" if answers == {200: 200} else str(dict(answers))
    if name == "two_files":
        body, kind = multipart(("a.png", small), ("b.png", small))
        return str((await http.post("/api/caption", content=body, headers={"Content-Type": kind})).status_code)
    if name == "wrong_boundary":
        body, _ = multipart(("a.png", small), boundary="other")
        return str((await http.post("/api/caption", content=body,
                                    headers={"Content-Type": "multipart/form-data; boundary=b"})).status_code)
    if name == "streamed_25mb":
        async def chunks():
            yield b"--b\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n\r\n"
            for _ in range(25):
                yield bytes(2**20)
        try:
            return str((await http.post("/api/caption", content=chunks(),
                                        headers={"Content-Type": "multipart/form-data; boundary=b"})).status_code)
        except httpx.HTTPError as error:    # the server may close while the rest is still being sent
            return type(error).__name__
    raise ValueError(f"no probe {name}")


PROBES = ["png", "overlay_4096", "foreign_host", "slow_head", "webp", "huge_head", "cross_origin_post", "pipelined_2000",
          "png16", "tiny_requests", "lying_length", "two_files", "bomb", "slow_upload", "wrong_boundary", "streamed_25mb"]
SLOW_PROBES = ("slow_head", "slow_upload")
"""Probes that wait for the server to cut them off (10 s, --timeout-s): a client leaves them running, at most
SLOW_AT_ONCE of them, and goes on with the battery."""
SLOW_AT_ONCE = 2


def hostile(url: str, small: bytes, ready, stop, results) -> None:
    """The hostile process: HOSTILE_CLIENTS clients each running the battery, in an order of its own, until
    ``stop`` is set; puts ``{probe: {outcome: count}}`` in ``results``."""
    payloads = hostile_payloads()
    port = int(url.rsplit(":", 1)[1])
    outcomes: dict[str, Counter] = {name: Counter() for name in PROBES}
    running: set[asyncio.Task] = set()

    async def run(name: str, http: httpx.AsyncClient) -> None:
        try:
            outcome = await probe(name, http, port, payloads, small)
        except httpx.HTTPError as error:
            outcome = type(error).__name__
        except asyncio.CancelledError:
            outcomes[name]["still waiting at the end"] += 1
            raise
        outcomes[name][outcome] += 1

    async def client(seed: int) -> None:
        order, slow = list(PROBES), set()
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            while True:
                random.Random(seed).shuffle(order)
                seed += HOSTILE_CLIENTS
                for name in order:
                    if name not in SLOW_PROBES:
                        await run(name, http)
                    elif len(slow) < SLOW_AT_ONCE:
                        task = asyncio.create_task(run(name, http))
                        for tasks in (slow, running):
                            tasks.add(task)
                            task.add_done_callback(tasks.discard)

    async def battery() -> None:
        running.update(asyncio.create_task(client(k)) for k in range(HOSTILE_CLIENTS))
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    asyncio.run(battery())
    results.put({name: dict(counts) for name, counts in outcomes.items()})


async def legitimate(url: str, images: list[bytes], requests: int, time_limit: float) -> dict:
    """CLIENTS clients sending ``requests`` shapes images in all (fewer if ``time_limit`` s pass)."""
    latencies, codes, sent = [], Counter(), 0
    deadline = time.perf_counter() + time_limit

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal sent
        while sent < requests and time.perf_counter() < deadline:
            image = images[sent % len(images)]
            sent += 1
            started = time.perf_counter()
            try:
                code = str((await http.post("/api/caption", files={"image": ("shapes.png", image)})).status_code)
            except httpx.HTTPError as error:
                code = type(error).__name__
            latencies.append(time.perf_counter() - started)
            codes[code] += 1

    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(CLIENTS)))
        seconds = time.perf_counter() - started
    milliseconds = np.array(latencies) * 1000
    failures = sum(count for code, count in codes.items() if code != "200" and code != "503")
    return {"requests": len(latencies), "statuses": dict(codes), "failed_other_than_declared_503": failures,
            "seconds": round(seconds, 2), "images_per_s": round(codes["200"] / seconds, 2),
            "latency_ms": {f"p{q}": round(float(np.percentile(milliseconds, q)), 1) for q in (50, 95, 99)}}


class PeakMemory:
    """The server's resident memory (its processes together), sampled every 20 ms in a thread: the peak of
    the phase in progress."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> PeakMemory:
        self.peak = rss_mb(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def measure(args, checkpoint: Path, images: list[bytes]) -> dict:
    results: dict = {}
    with live_server(checkpoint, [], args.threads, args.device) as (url, pid):
        asyncio.run(legitimate(url, images, 64, args.time_limit))         # warm-up
        idle = rss_mb(pid)
        print("legitimate clients alone ...", file=sys.stderr)
        with PeakMemory(pid) as memory:
            results["alone"] = asyncio.run(legitimate(url, images, args.requests, args.time_limit))
        results["alone"]["peak_rss_mb"] = round(memory.peak, 1)
        context = multiprocessing.get_context("spawn")
        ready, stop, outcomes = context.Event(), context.Event(), context.Queue()
        attacker = context.Process(target=hostile, args=(url, images[0], ready, stop, outcomes), daemon=True)
        attacker.start()
        if not ready.wait(300):
            raise RuntimeError("the hostile clients did not start")
        print("legitimate clients beside the hostile ones ...", file=sys.stderr)
        with PeakMemory(pid) as memory:
            time.sleep(5)           # the battery under way first
            results["under_attack"] = asyncio.run(legitimate(url, images, args.requests, args.time_limit))
            stop.set()
            results["hostile_outcomes"] = outcomes.get(timeout=60)
            attacker.join(60)
        results["under_attack"]["peak_rss_mb"] = round(memory.peak, 1)
        deadline = time.monotonic() + 120       # the hostile requests already in the server run their course
        while httpx.get(f"{url}/health").json()["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.5)
        after = httpx.post(f"{url}/api/caption", files={"image": ("shapes.png", images[0])}, timeout=60).status_code
        results["memory"] = {"idle_rss_mb": round(idle, 1), "ceiling_above_idle_mb": round(PEAK_ABOVE_IDLE / 2**20),
                             "peak_above_idle_mb": round(max(results["alone"]["peak_rss_mb"],
                                                             results["under_attack"]["peak_rss_mb"]) - idle, 1),
                             "rss_mb_after_the_hostile_requests": round(rss_mb(pid), 1)}
        results["answers_after"] = after
    ratio = {q: round(results["under_attack"]["latency_ms"][q] / results["alone"]["latency_ms"][q], 2) for q in ("p50", "p95")}
    results["latency_under_attack_over_alone"] = ratio
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--checkpoint", help=f"checkpoint to serve (default: {DEMO_SOFT.relative_to(ROOT)} "
                                             "when there, else that model with random weights)")
    parser.add_argument("--requests", type=int, default=None, help="legitimate requests per phase (default 1000; "
                                                                  "--quick 200)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds per phase at most (default 300)")
    args = parser.parse_args()
    args.requests = args.requests or (200 if args.quick else 1000)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        shapes = Path(folder) / "shapes"
        generate_shapes(shapes, seed=0, num_images=40)
        images = [path.read_bytes() for path in sorted((shapes / "images").rglob("*.png"))]
        if args.checkpoint or DEMO_SOFT.exists():
            checkpoint, served = Path(args.checkpoint or DEMO_SOFT), str(args.checkpoint or DEMO_SOFT)
        else:
            checkpoint, served = random_demo_checkpoint(Path(folder), shapes), "configs/demo_soft.yaml, random weights"
        results = measure(args, checkpoint, images)
    report("serve_soak", {"checkpoint": served, "clients": CLIENTS, "hostile_clients": HOSTILE_CLIENTS,
                          "server_threads": args.threads, "device": args.device,
                          "load_average_before": [round(x, 2) for x in load_before], **results},
           configs=["demo_soft"], probes=["data demo_soft", "decode demo_soft data.features=features"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
