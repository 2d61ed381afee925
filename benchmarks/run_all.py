"""Every benchmark in one JSON object (``make bench``): the LSTM decoder at the paper's configuration
(training words/s, share of the matmul peak, beam-search images/s), the Transformer decoder (training
words/s, beam search with and without the key/value cache), how cost grows with batch, beam, T, L and B
(with peak memory), feature caching images/s, private memory of cached-feature training as the
cache grows, self-critical training images/s with the share of the step each part takes, and
``captioner serve`` under 1, 4 and 16 concurrent clients with dynamic batching on and off, and decoding
beside a busy Python thread against beside a busy process (why the server decodes in a process of its own),
``captioner serve`` soaked by 16 legitimate clients beside 16 hostile ones (latency, failures, peak memory), and a
full-scale COCO rehearsal (a COCO-2014-shaped tree of 10,000, 40,000 and 123,287 images through the real command
line, each stage's time and peak memory; about 10 minutes on a 2-core CPU and 1.1 GB kept under /tmp/coco_scale;
--quick: one tree of 500 images in a temporary folder, a minute), and ONNX Runtime against torch for decoding (the COCO
recipes' decoders, greedy and beam 3, 1 and 16 images) and encoding, and marginal attention's cost beside soft
attention's (training words/s and beam-search images/s over all regions and the k of highest alpha), and the
training engine's step against the bare step of the soft and Transformer recipes (what its loader, gradient clipping
and moving average add). Each script also runs alone; each prints its JSON and writes it, with the machine and what
made its numbers, to benchmarks/results/NAME.json (the docs' results tables are rendered from those files:
captioner.results).

    python benchmarks/run_all.py [--quick] [--threads N] [--device auto] [--only NAME ...] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name -> (script, whether it takes --device)
SCRIPTS = {"lstm_decoder": ("bench_decoder.py", False), "transformer_decoder": ("bench_transformer.py", True),
           "scaling": ("bench_scaling.py", True), "feature_cache": ("bench_feature_cache.py", True),
           "cache_memory": ("bench_cache_memory.py", False), "scst": ("bench_scst.py", True),
           "serve": ("bench_serve.py", True), "decode_beside_python": ("bench_decode_beside_python.py", False),
           "serve_soak": ("bench_serve_soak.py", True), "coco_scale": ("bench_coco_scale.py", False),
           "onnx": ("bench_onnx.py", False), "marginal_attention": ("bench_marginal.py", True),
           "engine_step": ("bench_engine_step.py", True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps (rough numbers in a minute or two)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for every benchmark (default 1)")
    parser.add_argument("--device", default="auto", help="for the benchmarks that can use a GPU")
    parser.add_argument("--only", nargs="+", choices=sorted(SCRIPTS), help="run only these benchmarks")
    parser.add_argument("--out", help="also write the JSON to this file")
    args = parser.parse_args()
    results = {}
    for name, (script, takes_device) in SCRIPTS.items():
        if args.only and name not in args.only:
            continue
        command = ([sys.executable, str(HERE / script), "--threads", str(args.threads)] + (["--quick"] if args.quick else [])
                   + (["--device", args.device] if takes_device else []))
        print(f"running {script} ...", file=sys.stderr)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{script} failed:\n{done.stderr}", file=sys.stderr)
            return done.returncode
        results[name] = json.loads(done.stdout)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
