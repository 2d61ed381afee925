"""Serving throughput and latency of ``captioner serve`` under load, printed as JSON.

A live server (``python -m captioner serve --checkpoint CKPT --port 0``, its own process and its decoding process,
on 127.0.0.1 only) and N
concurrent clients (1, 4, 16: asyncio + httpx in this process) sending shapes images; each setting sends a
bounded number of requests (``--requests``) and stops early at ``--time-limit`` seconds. Per setting:
images/s, p50/p95/p99 latency, failed requests and the mean batch the server decoded; dynamic batching on
(``--max-batch 16 --max-wait-ms 10``) against off (``--max-batch 1``, one image at a time): both servers run
at once and each setting is measured in ``--rounds`` rounds, on and off in turn (the row shown is the median
round; the speedup at 16 clients is the median of the rounds' ratios). Then, batching on, the server's
resident memory (with its decoding process, and each process alone) before and after ``--memory-requests``
more requests from 16 clients.

The checkpoint: ``--checkpoint PATH``; by default the demo's trained soft-attention model
(``runs/demo/soft/best.pt`` after ``make demo``: MobileNetV2 at 128 px, 8x8 regions, LSTM 256, beam 3), which
writes the captions users get; without it, that model with random weights, whose captions end at once, so
that the figures are those of the server's own overhead rather than of decoding.

    python benchmarks/bench_serve.py [--quick] [--threads N] [--device auto] [--checkpoint CKPT] [--requests N]
                                     [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from common import add_arguments
from captioner.results.record import report

from captioner.checkpoint import build_model, save_checkpoint
from captioner.config import load_config
from captioner.data.shapes import generate_shapes
from captioner.data.vocabulary import Vocabulary

ROOT = Path(__file__).resolve().parent.parent
DEMO_SOFT = ROOT / "runs" / "demo" / "soft" / "best.pt"
CLIENTS = (1, 4, 16)
BATCHING = {"on": ["--max-batch", "16", "--max-wait-ms", "10"], "off": ["--max-batch", "1"]}


def random_demo_checkpoint(folder: Path, shapes: Path) -> Path:
    """configs/demo_soft.yaml with random weights and the shapes vocabulary, as a checkpoint in ``folder``."""
    captions = json.loads((shapes / "annotations" / "captions_train.json").read_text())["annotations"]
    vocab = Vocabulary.build([c["caption"] for c in captions], min_count=1)
    config = load_config(ROOT / "configs" / "demo_soft.yaml", ["encoder.pretrained=false",
                                                               f"run.out={folder / 'random-demo-soft'}"])
    model = build_model(config, len(vocab), pretrained=False)
    path = folder / "random-demo-soft.pt"
    save_checkpoint({"model": model.state_dict(), "vocab": vocab.to_dict(), "config": config.to_dict()}, path)
    return path


@contextmanager
def live_server(checkpoint: Path, options: list[str], threads: int, device: str):
    """``captioner serve`` in a process of its own on a free loopback port; yields ``(url, pid)``."""
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "captioner", "serve", "--checkpoint", str(checkpoint), "--host", "127.0.0.1",
               "--port", "0", "--device", device, *options]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in server.stdout], daemon=True).start()
    try:
        url = None
        while url is None:
            found = re.search(r"^captioner serve: .* at (http://127\.0\.0\.1:\d+)/", lines.get(timeout=300))
            url = found and found.group(1)
        yield url, server.pid
    finally:
        server.terminate()
        server.wait(timeout=60)


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` and its children (the server's decoding process)."""
    return own_rss_mb(pid) + sum(rss_mb(child) for child in children(pid))


def own_rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` alone."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def load(url: str, images: list[bytes], clients: int, requests: int, time_limit: float) -> dict:
    """``clients`` concurrent clients sending ``requests`` images in all (fewer if ``time_limit`` s pass)."""
    latencies, batches, failed, sent = [], [], 0, 0
    deadline = time.perf_counter() + time_limit

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal failed, sent
        while sent < requests and time.perf_counter() < deadline:
            image = images[sent % len(images)]
            sent += 1
            started = time.perf_counter()
            try:
                response = await http.post("/api/caption", files={"image": ("shapes.png", image, "image/png")})
                ok = response.status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - started)
            if ok:
                batches.append(response.json()["timings"]["batch_size"])
            else:
                failed += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        seconds = time.perf_counter() - started
    milliseconds = np.array(latencies) * 1000
    return {"clients": clients, "requests": len(latencies), "failed": failed, "seconds": round(seconds, 2),
            "images_per_s": round((len(latencies) - failed) / seconds, 2),
            "latency_ms": {f"p{q}": round(float(np.percentile(milliseconds, q)), 1) for q in (50, 95, 99)},
            "mean_batch": round(float(np.mean(batches)), 2) if batches else None}


def measure(args, checkpoint: Path, images: list[bytes]) -> dict:
    """Both servers (batching on and off) up at once; for each number of clients, ``args.rounds`` rounds of one
    setting after the other, so that the machine's drift hits both alike; the memory run last."""
    results: dict = {"settings": [], "rounds": args.rounds}
    with (live_server(checkpoint, BATCHING["on"], args.threads, args.device) as (url_on, pid_on),
          live_server(checkpoint, BATCHING["off"], args.threads, args.device) as (url_off, _)):
        urls = {"on": url_on, "off": url_off}
        for url in urls.values():     # warm-up: every batch size the measured settings will decode
            asyncio.run(load(url, images, CLIENTS[-1], 8 * CLIENTS[-1], args.time_limit))
        for clients in CLIENTS:
            rows: dict[str, list[dict]] = {"on": [], "off": []}
            for _ in range(args.rounds):
                for batching, url in urls.items():
                    print(f"batching {batching}, {clients} clients ...", file=sys.stderr)
                    rows[batching].append(asyncio.run(load(url, images, clients, args.requests, args.time_limit)))
            for batching, runs in rows.items():
                results["settings"].append({"batching": batching, "server_options": " ".join(BATCHING[batching]),
                                            **median_row(runs)})
            if clients == CLIENTS[-1]:
                results["at_16_clients"] = {
                    "speedup": round(statistics.median(a["images_per_s"] / b["images_per_s"]
                                                       for a, b in zip(rows["on"], rows["off"])), 2),
                    "speedup_per_round": [round(a["images_per_s"] / b["images_per_s"], 2)
                                          for a, b in zip(rows["on"], rows["off"])],
                    "p95_ms_on": [r["latency_ms"]["p95"] for r in rows["on"]],
                    "p95_ms_off": [r["latency_ms"]["p95"] for r in rows["off"]]}
        before = rss_mb(pid_on)
        processes = {"server_process_mb": round(own_rss_mb(pid_on), 1),   # the multiprocessing tracker is the small one
                     "decoding_process_mb": round(max(own_rss_mb(child) for child in children(pid_on)), 1)}
        print(f"memory: {args.memory_requests} requests ...", file=sys.stderr)
        row = asyncio.run(load(url_on, images, 16, args.memory_requests, 10 * args.time_limit))
        after = rss_mb(pid_on)
        results["memory"] = {"requests": row["requests"], "failed": row["failed"], "rss_mb_before": round(before, 1),
                             "rss_mb_after": round(after, 1), "growth_mb": round(after - before, 1),
                             "before_by_process": processes}
    return results


def median_row(runs: list[dict]) -> dict:
    """The round with the median images/s, with the failures of all rounds."""
    middle = sorted(runs, key=lambda r: r["images_per_s"])[len(runs) // 2]
    return {**middle, "failed": sum(r["failed"] for r in runs), "rounds_images_per_s": [r["images_per_s"] for r in runs]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--checkpoint", help=f"checkpoint to serve (default: {DEMO_SOFT.relative_to(ROOT)} when there, "
                                             "else that model with random weights)")
    parser.add_argument("--requests", type=int, default=None, help="requests per setting (default 200; --quick 48)")
    parser.add_argument("--memory-requests", type=int, default=None,
                        help="requests between the two memory readings (default 1000; --quick 200)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of each setting, on and off in turn "
                                                               "(default 3; --quick 1)")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per setting at most")
    args = parser.parse_args()
    args.requests = args.requests or (48 if args.quick else 200)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.memory_requests = args.memory_requests or (200 if args.quick else 1000)
    with tempfile.TemporaryDirectory() as folder:
        shapes = Path(folder) / "shapes"
        generate_shapes(shapes, seed=0, num_images=40)
        images = [path.read_bytes() for path in sorted((shapes / "images").rglob("*.png"))]
        if args.checkpoint or DEMO_SOFT.exists():
            checkpoint = Path(args.checkpoint or DEMO_SOFT)
            served = str(checkpoint)
        else:
            checkpoint = random_demo_checkpoint(Path(folder), shapes)
            served = "configs/demo_soft.yaml, random weights"
        results = measure(args, checkpoint, images)
    report("serve", {"checkpoint": served, "server_threads": args.threads, "device": args.device, **results},
           configs=["demo_soft"], probes=["data demo_soft", "decode demo_soft data.features=features"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
