"""Every benchmark in one JSON object (``make bench``): the LSTM decoder at the paper's configuration
(training words/s, share of the matmul peak, beam-search images/s) and the Transformer decoder (training
words/s, beam-search images/s with and without the key/value cache).

    python benchmarks/run_all.py [--quick] [--threads N] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = {"lstm_decoder": "bench_decoder.py", "transformer_decoder": "bench_transformer.py"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps (rough numbers in a minute or two)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for every benchmark (default 1)")
    parser.add_argument("--out", help="also write the JSON to this file")
    args = parser.parse_args()
    results = {}
    for name, script in SCRIPTS.items():
        command = [sys.executable, str(HERE / script), "--threads", str(args.threads)] + (["--quick"] if args.quick else [])
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
