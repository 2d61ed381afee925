"""Serving throughput and latency of ``captioner serve`` under load, printed as JSON.

A live server (``python -m captioner serve CKPT --port 0``, its own process, on 127.0.0.1 only) and N
concurrent clients (1, 4, 16: asyncio + httpx in this process) sending shapes images; each setting sends a
bounded number of requests (``--requests``) and stops early at ``--time-limit`` seconds. Per setting:
images/s, p50/p95/p99 latency, failed requests and the mean batch the server decoded; dynamic batching on
(``--max-batch 16 --max-wait-ms 10``) against off (``--max-batch 1``, one image at a time). Then, batching
on, the server's resident memory before and after ``--memory-requests`` more requests from 16 clients.

The checkpoint: ``--checkpoint PATH`` (e.g. runs/demo/soft/best.pt after ``make demo``), or by default the
demo's soft-attention model (configs/demo_soft.yaml: MobileNetV2 at 128 px, 8x8 regions, LSTM 256, beam 3)
with random weights: it rarely ends a caption, so each one runs the full 24 words, the worst case.

    python benchmarks/bench_serve.py [--quick] [--threads N] [--device auto] [--checkpoint CKPT] [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import re
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

from captioner.checkpoint import save_checkpoint
from captioner.config import load_config
from captioner.data.shapes import generate_shapes
from captioner.data.vocabulary import Vocabulary
from captioner.models.captioner import build_model

ROOT = Path(__file__).resolve().parent.parent
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
    save_checkpoint({"model": model.state_dict(), "vocab": vocab.to_dict(), "config": config}, path)
    return path


@contextmanager
def live_server(checkpoint: Path, options: list[str], threads: int, device: str):
    """``captioner serve`` in a process of its own on a free loopback port; yields ``(url, pid)``."""
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "captioner", "serve", str(checkpoint), "--host", "127.0.0.1", "--port", "0",
               "--device", device, *options]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in server.stdout], daemon=True).start()
    try:
        url = None
        while url is None:
            found = re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", lines.get(timeout=300))
            url = found and found.group(1)
        yield url, server.pid
    finally:
        server.terminate()
        server.wait(timeout=60)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


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
    results: dict = {"settings": []}
    for batching, options in BATCHING.items():
        with live_server(checkpoint, options, args.threads, args.device) as (url, pid):
            asyncio.run(load(url, images, 4, 16, args.time_limit))                      # warm-up
            for clients in CLIENTS:
                print(f"batching {batching}, {clients} clients ...", file=sys.stderr)
                row = asyncio.run(load(url, images, clients, args.requests, args.time_limit))
                results["settings"].append({"batching": batching, "server_options": " ".join(options), **row})
            if batching == "on":
                before = rss_mb(pid)
                print(f"memory: {args.memory_requests} requests ...", file=sys.stderr)
                row = asyncio.run(load(url, images, 16, args.memory_requests, 10 * args.time_limit))
                after = rss_mb(pid)
                results["memory"] = {"requests": row["requests"], "failed": row["failed"], "rss_mb_before": round(before, 1),
                                     "rss_mb_after": round(after, 1), "growth_mb": round(after - before, 1)}
    on, off = ({r["clients"]: r for r in results["settings"] if r["batching"] == b} for b in ("on", "off"))
    results["at_16_clients"] = {"speedup": round(on[16]["images_per_s"] / off[16]["images_per_s"], 2),
                                "p95_ms_on": on[16]["latency_ms"]["p95"], "p95_ms_off": off[16]["latency_ms"]["p95"]}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--checkpoint", help="checkpoint to serve (default: the demo's soft model, random weights)")
    parser.add_argument("--requests", type=int, default=None, help="requests per setting (default 200; --quick 48)")
    parser.add_argument("--memory-requests", type=int, default=None,
                        help="requests between the two memory readings (default 1000; --quick 200)")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per setting at most")
    args = parser.parse_args()
    args.requests = args.requests or (48 if args.quick else 200)
    args.memory_requests = args.memory_requests or (200 if args.quick else 1000)
    with tempfile.TemporaryDirectory() as folder:
        shapes = Path(folder) / "shapes"
        generate_shapes(shapes, seed=0, num_images=40)
        images = [path.read_bytes() for path in sorted((shapes / "images").rglob("*.png"))]
        checkpoint = Path(args.checkpoint) if args.checkpoint else random_demo_checkpoint(Path(folder), shapes)
        results = measure(args, checkpoint, images)
    print(json.dumps({"checkpoint": args.checkpoint or "configs/demo_soft.yaml, random weights",
                      "server_threads": args.threads, "device": args.device, "cpu_count": os.cpu_count(),
                      "machine": platform.processor() or platform.machine(), **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
