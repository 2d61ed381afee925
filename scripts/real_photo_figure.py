"""Draw a model's attention on a real photo that may be published: the photos scikit-image ships (public domain
or CC0, see ``skimage.data``), not the research-only Flickr or COCO images. The docs' real-photo figure is

    python scripts/real_photo_figure.py runs/flickr8k_soft/best.pt --photo astronaut --out docs/flickr_attention.png

It writes the photo to a temporary PNG and runs what ``captioner attend`` runs on it.
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
    parser.add_argument("checkpoint")
    parser.add_argument("--photo", choices=sorted(PHOTOS), default="astronaut")
    parser.add_argument("--out", required=True, help="the figure (PNG)")
    parser.add_argument("--beam", type=int, default=None)
    parser.add_argument("--width", type=int, default=800, help="the figure is shrunk to this many pixels wide and "
                        "saved with 128 colours, small enough for a README")
    args = parser.parse_args()
    predictor = Predictor.load(args.checkpoint, beam=args.beam)
    with tempfile.TemporaryDirectory() as folder:
        photo = Path(folder) / f"{args.photo}.png"
        Image.fromarray(getattr(data, args.photo)()).save(photo)
        result = predictor.attend(photo, args.out)
    figure = Image.open(args.out).convert("RGB")
    if figure.width > args.width:
        figure = figure.resize((args.width, round(figure.height * args.width / figure.width)), Image.LANCZOS)
    figure.quantize(128).save(args.out, optimize=True)
    print(f"{args.photo} ({PHOTOS[args.photo]}): {result.caption}\nwrote {args.out}")


if __name__ == "__main__":
    main()
