"""How faithful an export is to its checkpoint: each run's best.pt exported as float32 (with ONNX graphs), float16
and bfloat16, and the test split captioned by the checkpoint, by each export in torch and by the float32 export in
ONNX Runtime, with the run's own decode settings, from the images (not a feature cache, so that the ONNX encoder is
measured too). Prints JSON: per run and variant, the share of images whose caption
is the checkpoint's, the largest and median difference of the caption's log-probability where it is, and the test
scores (BLEU-4, CIDEr) of each.

    python scripts/export_fidelity.py runs/demo/soft runs/demo/hard runs/demo/transformer [--split test]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from captioner import Predictor
from captioner.core.process import set_up_process
from captioner.evaluation.caption_metrics import score_captions
from captioner.evaluation.generate import caption_texts
from captioner.workflows.evaluate import split_dataset
from captioner.workflows.export import export_checkpoint

IMAGES = ["data.features=null"]      # every variant encodes the images itself


def captions(predictor: Predictor, split: str) -> tuple[dict, dict]:
    """``({image_id: Generation}, {image_id: [reference captions]})`` of the split."""
    dataset = split_dataset(predictor.config, split, predictor.vocab, predictor.model)
    return predictor.generate(dataset), {r.image_id: r.captions for r in dataset.records}


def compare(expected: dict, got: dict) -> dict:
    same = [i for i in expected if expected[i].tokens == got[i].tokens]
    differences = [abs(expected[i].log_prob - got[i].log_prob) for i in same]
    return {"same_caption": round(len(same) / len(expected), 4), "images": len(expected),
            "max_log_prob_difference": max(differences, default=None),
            "median_log_prob_difference": statistics.median(differences) if differences else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders with a best.pt")
    parser.add_argument("--split", default="test")
    args = parser.parse_args()
    result = {}
    with tempfile.TemporaryDirectory() as folder:
        for run in args.runs:
            checkpoint = run / "best.pt"
            reference = Predictor.load(checkpoint, overrides=IMAGES)
            expected, references = captions(reference, args.split)
            scores = {"checkpoint": score_captions(references, caption_texts(expected, reference.vocab))}
            variants = {}
            for dtype in ("float32", "float16", "bfloat16"):
                out = Path(folder) / f"{run.name}_{dtype}"
                export_checkpoint(checkpoint, out, dtype=dtype, onnx=dtype == "float32")
                runtimes = ("torch", "onnx") if dtype == "float32" else ("torch",)
                for runtime in runtimes:
                    predictor = Predictor.load(out, runtime=runtime, overrides=IMAGES)
                    got, _ = captions(predictor, args.split)
                    name = f"{dtype}_{runtime}"
                    variants[name] = compare(expected, got)
                    scores[name] = score_captions(references, caption_texts(got, predictor.vocab))
            for name, variant in variants.items():
                variant.update({k: round(scores[name][k], 4) for k in ("BLEU-4", "CIDEr")})
            result[run.name] = {"checkpoint": {k: round(scores["checkpoint"][k], 4) for k in ("BLEU-4", "CIDEr")},
                                **variants}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    set_up_process()    # as every captioner command: its times are those of captioner train
    main()
