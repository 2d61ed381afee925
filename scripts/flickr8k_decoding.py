"""The effect of each decoding option on real photos: the Flickr recipe's model (scripts/flickr8k_dev.sh,
runs/flickr8k_soft/best.pt) decodes its 100 validation photos (the first 100 of data/flickr8k, which captioner data
flickr8k --root data/flickr8k makes; the study itself ran on an earlier 800-photo subset) with each setting
below, and a table of BLEU-4, METEOR, CIDEr and the diversity measures is printed (the history of
the decoding options: CHANGELOG.md). The ensemble needs a second seed of the recipe, trained here when missing
(runs/flickr8k_soft_seed1, about 10 minutes on 2 cores).

    python scripts/flickr8k_decoding.py [--out runs/flickr8k_decoding]

Never commit what it writes (runs/): it derives from research-only photos.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from captioner.config import load_config
from captioner.core.process import set_up_process
from captioner.training.engine import train
from captioner.workflows.evaluate import evaluate_checkpoint

ROOT = Path(__file__).resolve().parent.parent
FIRST, SECOND = ROOT / "runs" / "flickr8k_soft" / "best.pt", ROOT / "runs" / "flickr8k_soft_seed1" / "best.pt"

SETTINGS = {   # name -> (checkpoints, overrides)
    "beam 3, <unk> allowed (the defaults before decoding options)": ([FIRST], ["decode.suppress_unk=false"]),
    "beam 3, suppress_unk (today's default)": ([FIRST], []),
    "+ block_ngram=3": ([FIRST], ["decode.block_ngram=3"]),
    "diverse beam: 3 groups of 1, diversity 0.5": ([FIRST], ["decode.beam_groups=3"]),
    "nucleus sampling, p = 0.9": ([FIRST], ["decode.method=sample", "decode.top_p=0.9"]),
    "ensemble of seeds 0 and 1, beam 3": ([FIRST, SECOND], []),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "runs" / "flickr8k_decoding"))
    args = parser.parse_args()
    if not FIRST.exists():
        raise SystemExit(f"{FIRST}: run scripts/flickr8k_dev.sh first")
    if not SECOND.exists():
        train(load_config(ROOT / "configs" / "flickr8k_soft.yaml", ["run.seed=1", f"run.out={SECOND.parent}"]))
    rows = []
    for index, (name, (checkpoints, overrides)) in enumerate(SETTINGS.items()):
        scores = evaluate_checkpoint([str(c) for c in checkpoints], "val", overrides=overrides,
                                     out_dir=Path(args.out) / str(index), progress=False)
        with_unk = sum("<unk>" in line for line in
                       (c["caption"] for c in json.loads((Path(args.out) / str(index) / "captions_val.json").read_text())))
        d = scores["diversity"]
        rows.append(f"| {name} | {scores['BLEU-4']:.3f} | {scores['METEOR']:.3f} | {scores['CIDEr']:.3f} | "
                    f"{d['distinct_captions']:.2f} | {d['vocabulary_used']} | {with_unk} | {d['repeated_bigram']:.2f} | "
                    f"{d['dangling_end']:.2f} |")
    print("| decoding | BLEU-4 | METEOR | CIDEr | distinct captions | words used | captions with <unk> | "
          "repeated bigram | dangling end |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    set_up_process()    # as every captioner command: its times are those of captioner train
    main()
