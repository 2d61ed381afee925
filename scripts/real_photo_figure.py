"""Draw models' attention on a real photo that may be published: the photos scikit-image ships (public domain
or CC0, see ``skimage.data``), not the research-only Flickr or COCO images. The docs' real-photo figures are

    python scripts/real_photo_figure.py runs/flickr8k_soft/best.pt --photo astronaut --out docs/flickr_attention.png
    python scripts/real_photo_figure.py runs/flickr8k_full_soft/best.pt runs/flickr8k_full_hard/best.pt \
        runs/flickr8k_full_marginal/best.pt --label soft --label hard --label marginal --photo astronaut \
        --width 600 --out docs/soft_hard_marginal_attention.png

It writes the photo to a temporary PNG and runs what ``captioner attend`` runs on it, once per checkpoint; several
checkpoints' figures are stacked, one above the other, each titled with its label.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from PIL import Image
from skimage import data

from captioner import Predictor

PHOTOS = {   # skimage.data name -> its licence, as skimage.data documents it
    "astronaut": "public domain (NASA)",
    "chelsea": "CC0 (Stefan van der Walt)",
    "coffee": "CC0 (Rachel Michetti)",
    "rocket": "public domain (SpaceX)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", metavar="checkpoint")
    parser.add_argument("--label", action="append", default=[],
                        help="a title for each checkpoint's figure, in their order (default: its run folder)")
    parser.add_argument("--photo", choices=sorted(PHOTOS), default="astronaut")
    parser.add_argument("--out", required=True, help="the figure (PNG)")
    parser.add_argument("--beam", type=int, default=None)
    parser.add_argument("--width", type=int, default=800, help="the figure is shrunk to this many pixels wide and "
                        "saved with 128 colours, small enough for a README")
    args = parser.parse_args()
    if args.label and len(args.label) != len(args.checkpoints):
        parser.error(f"{len(args.label)} --label for {len(args.checkpoints)} checkpoints")
    labels = args.label or ([Path(c).parent.name for c in args.checkpoints] if len(args.checkpoints) > 1 else [""])
    panels = []
    with tempfile.TemporaryDirectory() as folder:
        photo = Path(folder) / f"{args.photo}.png"
        Image.fromarray(getattr(data, args.photo)()).save(photo)
        for index, (checkpoint, label) in enumerate(zip(args.checkpoints, labels)):
            out = Path(folder) / f"figure_{index}.png"
            result = Predictor.load(checkpoint, beam=args.beam).attend(photo, out, title=f"{label}: " if label else "")
            panels.append(shrunk(Image.open(out).convert("RGB"), args.width))
            print(f"{args.photo} ({PHOTOS[args.photo]}), {label or checkpoint}: {result.caption}")
    figure = Image.new("RGB", (max(p.width for p in panels), sum(p.height for p in panels)), "white")
    top = 0
    for panel in panels:
        figure.paste(panel, (0, top))
        top += panel.height
    figure.quantize(128).save(args.out, optimize=True)
    print(f"wrote {args.out}")


def shrunk(figure: Image.Image, width: int) -> Image.Image:
    """``figure`` at most ``width`` pixels wide."""
    if figure.width <= width:
        return figure
    return figure.resize((width, round(figure.height * width / figure.width)), Image.LANCZOS)


if __name__ == "__main__":
    main()
