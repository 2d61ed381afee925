"""Decoding settings on the Flickr8k study's trained models: each run's best checkpoint (``runs/flickr8k_full/RUN``,
trained by ``scripts/flickr8k_study.py``, its entry saved in ``benchmarks/results/flickr8k_full.json``, or a trial's
in ``flickr8k_trials.json``) decodes the 1,000 validation photos of ``data/flickr8k`` with each setting of
:data:`DECODINGS` (each over the run's recipe's own decoding), and the scores (BLEU-1..4, METEOR, ROUGE-L, CIDEr,
words used, distinct captions, mean length) go to ``benchmarks/results/flickr8k_decoding.json``, one entry per run
and setting, which the docs' results page renders with the mean over each recipe's seeds. A run whose entry is
missing or made otherwise than its recipe now says is refused: its checkpoint is not that recipe's model.

    python scripts/flickr8k_decoding.py soft_s0 soft_s1 soft_s2
    python scripts/flickr8k_decoding.py soft_s2 --decodings "beam 5, length penalty 0.5"
    python scripts/flickr8k_decoding.py soft_s2_ema999                # a trial

Never commit the run folders' captions (runs/): they derive from research-only photos.
"""

from __future__ import annotations

import argparse
import logging
import time

from flickr8k_study import METRICS, RESULTS, RUNS
from flickr8k_study import made_by as study_made_by

from captioner.checkpoint import load_checkpoint
from captioner.core.console import LOG_FORMAT
from captioner.core.process import set_up_process
from captioner.results.fingerprint import ConfigRef, probe_name
from captioner.results.record import add_entry, entries_made_otherwise, load_results
from captioner.workflows.evaluate import evaluate_checkpoint

# name -> decode overrides, each over the recipe's own decoding (for the study's VGG-19 recipes: beam 3, at most 22
# words, bigram blocking, no dangling end, no length penalty)
DECODINGS = {"the recipe's": [],
             "beam 5": ["decode.beam=5"],
             "beam 3, length penalty 0.5": ["decode.length_penalty=0.5"],
             "beam 5, length penalty 0.5": ["decode.beam=5", "decode.length_penalty=0.5"],
             "beam 5, length penalty 1": ["decode.beam=5", "decode.length_penalty=1.0"]}
SAVE = "flickr8k_decoding"
SOURCES = (RESULTS, "flickr8k_trials")      # the study's runs, and its trials (a recipe with a few settings changed)


def study_entry(run: str) -> tuple[str, dict]:
    """The result (:data:`SOURCES`) that holds ``run`` and its entry there; refused where it is missing, made
    otherwise than its recipe (with the trial's overrides) now says, an ablation or a fine-tuned run, or its
    checkpoint is not on this machine."""
    for source in SOURCES:
        saved = (load_results().get(source) or {}).get("result", {}).get("runs", {})
        if run in saved:
            break
    else:
        raise SystemExit(f"{run}: no such run in benchmarks/results/ {' or '.join(f'{s}.json' for s in SOURCES)} "
                         "(scripts/flickr8k_study.py)")
    if reasons := entries_made_otherwise(source, "runs").get(run):
        raise SystemExit(f"{run}: its entry in {source}.json was made otherwise than its recipe now says "
                         f"({'; '.join(reasons)}); train it again with scripts/flickr8k_study.py")
    if saved[run].get("after") or saved[run]["ablation"]:
        raise SystemExit(f"{run}: an ablation or a run fine-tuned from another; decode the recipes' own runs")
    best = RUNS / run / "best.pt"
    if not best.exists():
        raise SystemExit(f"{best}: not on this machine (scripts/flickr8k_study.py trains it)")
    (metric, score), = saved[run]["best_val_metric"].items()
    if round(load_checkpoint(best)["progress"]["best"], 4) != score:
        raise SystemExit(f"{best}: not the checkpoint of the run saved in {source}.json (its best validation {metric} "
                         f"differs from the saved {score}): trained again since, and not saved")
    return source, saved[run]


def decode(run: str, source: str, entry: dict, decoding: str) -> dict:
    """Score ``run``'s best checkpoint (its ``entry`` in the result ``source``: :func:`study_entry`) on the validation
    photos with ``decoding``; save and return the entry."""
    trial = [o for o in entry["overrides"] if not o.startswith("run.seed=")]   # a trial's changes to its recipe
    overrides = DECODINGS[decoding]
    started = time.perf_counter()
    scores = evaluate_checkpoint(RUNS / run / "best.pt", "val", overrides=overrides, progress=False,
                                 out_dir=RUNS / run / "decodings" / decoding.replace(" ", "_").replace(",", ""))
    seconds = time.perf_counter() - started
    result = {"run": run, "source": source, "recipe": entry["recipe"], "trial": trial, "seed": entry["seed"],
              "decoding": decoding, "overrides": overrides, "validation_images": scores["images"],
              "val": {k: round(scores[k], 4) for k in METRICS},
              "diversity": {k: round(scores["diversity"][k], 4)
                            for k in ("vocabulary_used", "distinct_captions", "mean_length")},
              "decode_seconds": round(seconds, 1)}
    trained_keys, trained_probes = study_made_by(entry["kind"], False, trial)
    decoded = ConfigRef(entry["recipe"], (*trial, *overrides))
    add_entry(SAVE, "runs", f"{run} | {decoding}", result, configs=list(dict.fromkeys([*trained_keys, decoded.key])),
              probes=list(dict.fromkeys([*trained_probes, probe_name("decode", decoded)])))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN", help="the study's runs, e.g. soft_s0 (runs/flickr8k_full/RUN)")
    parser.add_argument("--decodings", nargs="+", choices=list(DECODINGS), default=list(DECODINGS),
                        help="the settings to decode with (default: all)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    studied = {run: study_entry(run) for run in args.runs}     # every run refused before the first is decoded
    for run, (source, entry) in studied.items():
        for decoding in args.decodings:
            result = decode(run, source, entry, decoding)
            print(f"{run} | {decoding}: CIDEr {result['val']['CIDEr']:.4f}, BLEU-4 {result['val']['BLEU-4']:.4f}, "
                  f"METEOR {result['val']['METEOR']:.4f}, {result['diversity']['vocabulary_used']} words "
                  f"({result['decode_seconds']:.0f} s)", flush=True)


if __name__ == "__main__":
    set_up_process()    # as every captioner command
    main()
