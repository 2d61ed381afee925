"""``captioner data shapes|vocab|coco|flickr8k``: generate the shapes dataset, build a config's vocabulary, set MS-COCO
or Flickr8k up."""

from __future__ import annotations

import argparse
import json

from captioner.commands.options import CONFIG_HELP, add_overrides


def add_parser(commands) -> None:
    data = commands.add_parser("data", help="make or prepare datasets")
    datasets = data.add_subparsers(dest="data_command", required=True, metavar="DATASET")
    shapes = datasets.add_parser("shapes", help="generate the synthetic shapes dataset (COCO format)")
    shapes.add_argument("--out", required=True, help="output folder")
    shapes.add_argument("--seed", type=int, default=0)
    shapes.add_argument("--images", type=int, default=3000, help="number of images (all splits)")
    shapes.add_argument("--image-size", type=int, default=128)
    shapes.set_defaults(func=run_shapes)
    vocab = datasets.add_parser("vocab", help="build the vocabulary of a config's train split and report its coverage")
    vocab.add_argument("config", help=CONFIG_HELP)
    add_overrides(vocab, "overrides, e.g. data.vocab_min_count=3")
    vocab.add_argument("--out", help="vocabulary file to write (default: data.vocab)")
    vocab.set_defaults(func=run_vocab)
    add_coco_parser(datasets)
    add_flickr8k_parser(datasets)


def add_coco_parser(datasets) -> None:
    coco = datasets.add_parser("coco", help="download and prepare MS-COCO for configs/coco_*.yaml: images, "
                               "annotations, the split, vocabulary (resumable; a second run only verifies)")
    coco.add_argument("--root", required=True, help="folder to set COCO up in (the configs read data/coco)")
    coco.add_argument("--year", type=int, choices=(2014, 2017), default=2014,
                      help="which release of the images to download (default: 2014, the paper's)")
    coco.add_argument("--split", choices=("karpathy", "official"), default="karpathy",
                      help="karpathy (default): Karpathy's 113,287/5,000/5,000 split; official (2017 only): "
                           "train2017 less 5,000 held-out images as val, val2017 as test")
    coco.add_argument("--keep-zips", action="store_true",
                      help="keep the downloaded zips in ROOT/downloads (default: each is deleted once unpacked)")
    coco.add_argument("--karpathy-file", default=None, metavar="FILE",
                      help="a Karpathy split obtained by hand, tried first: dataset_coco.json, caption_datasets.zip "
                           "or the folder of BLIP's coco_karpathy_{train,val,test}.json (default: download it)")
    coco.set_defaults(func=run_coco)


def add_flickr8k_parser(datasets) -> None:
    flickr = datasets.add_parser("flickr8k", help="download and prepare Flickr8k for configs/flickr8k_*.yaml: photos, "
                                 "captions, the official split (resumable; a second run only verifies)")
    flickr.add_argument("--root", required=True, help="folder to set Flickr8k up in (the configs read data/flickr8k)")
    flickr.add_argument("--from", dest="source", default=None, metavar="PATH",
                        help="prepare from what you have, without the network: a folder with Flickr8k_Dataset.zip and "
                             "Flickr8k_text.zip, with their unpacked contents, or with photos and a Karpathy-format "
                             "dataset_flickr8k.json")
    flickr.add_argument("--keep-zips", action="store_true",
                        help="keep the downloaded zips in ROOT/downloads (default: each is deleted once unpacked)")
    flickr.set_defaults(func=run_flickr8k)


def run_shapes(args: argparse.Namespace) -> int:
    from captioner.data.shapes import generate_shapes

    summary = generate_shapes(args.out, seed=args.seed, num_images=args.images, image_size=args.image_size)
    print(json.dumps(summary, indent=2, default=str))
    return 0


def run_vocab(args: argparse.Namespace) -> int:
    from captioner.config import load_config
    from captioner.data.vocabulary import vocabulary_report

    config = load_config(args.config, args.overrides)
    print(json.dumps(vocabulary_report(config.data, args.out), indent=2))
    return 0


def run_coco(args: argparse.Namespace) -> int:
    from captioner.data.coco_setup import format_summary, setup_coco

    result = setup_coco(args.root, year=args.year, split=args.split, keep_zips=args.keep_zips,
                        karpathy_file=args.karpathy_file)
    print(format_summary(result))
    return 0


def run_flickr8k(args: argparse.Namespace) -> int:
    from captioner.data.flickr8k_setup import format_summary, setup_flickr8k

    print(format_summary(setup_flickr8k(args.root, source=args.source, keep_zips=args.keep_zips)))
    return 0
