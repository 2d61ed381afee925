"""One-off: key every committed result by what made it (its settings and the fingerprint of the code's behaviour,
:mod:`captioner.results`) instead of the SHA-256 of its input files. Only a result whose input files are byte for
byte those it was measured with is re-keyed (the library's files as they are, the scripts as committed: they change
here only in how they write results): the code as it is now is then the code that made its numbers, and its
fingerprint is theirs. Run once, before any library file a result depends on changes.

    python scripts/rekey_results.py
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from captioner.results.record import RESULTS_DIR, ROOT, made_by, save


import demo_results
import flickr8k_study
import hard_attention_diagnosis as diagnosis
import recipe_time

FEATURES = "data.features=features"     # a benchmark's probe reads features, as its decoder is fed


def what_made(name: str, record: dict) -> tuple[list[str], list[str]]:
    """The configs and probes of a committed result: those its script declares now."""
    if name == "flickr8k_full":
        return flickr8k_study.CONFIGS, flickr8k_study.PROBES
    if name == "flickr8k_ensembles":
        ensemble = f"ensemble {' '.join(flickr8k_study.KINDS.values())}"
        return flickr8k_study.CONFIGS, [*flickr8k_study.PROBES, ensemble]
    if name == "recipe_times":
        return recipe_time.RECIPES, recipe_time.PROBES
    if name in ("hard_attention_runs", "expectation_only_runs"):
        return diagnosis.runs_made_by(record["result"]["runs"])
    if name == "hard_attention_snr":     # the checkpoint of the diagnosis run word_moving
        runs = json.loads((RESULTS_DIR / "hard_attention_runs.json").read_text())["result"]["runs"]
        changes = next(r["changes"] for r in runs if r["run"] == "word_moving")
        return diagnosis.snr_made_by([c for c in changes if not c.startswith(diagnosis.LENGTH_AND_START)])
    if name == "demo":
        return demo_results.CONFIGS, demo_results.PROBES
    if name == "decode_beside_python":   # as benchmarks/bench_decode_beside_python.py declares
        return ["demo_soft"], ["data demo_soft", f"decode demo_soft {FEATURES}"]
    if name == "scaling":                # benchmarks/bench_scaling.py
        configs = ["defaults", "defaults model.lstm.attention_mode=hard",
                   "defaults model.decoder=transformer loss.doubly_stochastic=0"]
        return configs, [f"train {c} {FEATURES}" for c in configs] + [
            f"decode {c} {FEATURES}" for c in (configs[0], configs[2])]
    if name == "scst":                   # benchmarks/bench_scst.py
        configs = ["defaults train.objective=scst", "defaults train.objective=scst train.scst_baseline=greedy"]
        return configs, [f"train {c} {FEATURES}" for c in configs]
    raise SystemExit(f"{name}: no rule says what made it")


def measured_with(path: str) -> bytes | None:
    """The bytes a result's input is to match: the library's file as it is in the checkout, a script's as of the
    last commit (the scripts change here only in how they write their results)."""
    if path.startswith(("scripts/", "benchmarks/")):
        done = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True)
        return done.stdout if done.returncode == 0 else None
    return (ROOT / path).read_bytes() if (ROOT / path).is_file() else None


def main() -> int:
    for path in sorted(RESULTS_DIR.glob("*.json")):
        record = json.loads(path.read_text())
        if "inputs" not in record:
            print(f"{path.name}: already keyed by what made it")
            continue
        changed = [p for p, sha in record["inputs"].items()
                   if (found := measured_with(p)) is None or hashlib.sha256(found).hexdigest() != sha]
        if changed:
            print(f"{path.name}: measured with other versions of {', '.join(changed)}; not re-keyed", file=sys.stderr)
            continue
        configs, probes = what_made(record["name"], record)
        keyed = {k: record[k] for k in ("name", "command", "machine")} | made_by(configs, probes)
        save(keyed | {"result": record["result"]})
        print(f"{path.name}: {len(configs)} configs, {len(probes)} probes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
