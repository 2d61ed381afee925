"""The ``captioner`` command line: data (shapes, vocab), config, cache-features, train, evaluate, ground,
caption, attend, compare, demo.

User errors (bad files, configs, checkpoints, unwritable folders, full disks) print one line naming the file and what is wrong and exit
with status 1; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from captioner.errors import CaptionerError


def _cmd_data_shapes(args) -> int:
    from captioner.data.shapes import generate_shapes

    summary = generate_shapes(args.out, seed=args.seed, num_images=args.images, image_size=args.image_size)
    print(json.dumps(summary, indent=2, default=str))
    return 0


def _cmd_data_vocab(args) -> int:
    from collections import Counter

    from captioner.config import load_config
    from captioner.data.readers import read_split
    from captioner.data.vocabulary import Vocabulary, save_vocabulary, tokenize

    config = load_config(args.config, args.overrides)
    data = config["data"]
    out = args.out or data["vocab"]
    if not out:
        raise CaptionerError("data vocab: set data.vocab in the config (or pass --out FILE)")
    captions = [tokenize(c) for r in read_split(data, "train") for c in r.captions]
    vocab = Vocabulary.build((" ".join(t) for t in captions), data["vocab_min_count"], data["vocab_max_size"])
    counts = Counter(word for tokens in captions for word in tokens)
    covered = sum(n for word, n in counts.items() if word in vocab.index)
    lengths = sorted(len(t) for t in captions)
    save_vocabulary(vocab, out)
    print(json.dumps({"vocabulary": out, "words": len(vocab), "train_captions": len(captions),
                      "distinct_train_words": len(counts), "token_coverage": round(covered / max(sum(counts.values()), 1), 4),
                      "caption_length_p50_p95_max": [lengths[len(lengths) // 2], lengths[int(len(lengths) * 0.95)],
                                                     lengths[-1]] if lengths else None,
                      "cut_at_max_caption_length": sum(n > data["max_caption_length"] for n in lengths)}, indent=2))
    return 0


def _cmd_config(args) -> int:
    from captioner.config import config_reference, load_config

    if args.reference:
        print(config_reference(), end="")
        return 0
    import yaml

    print(yaml.safe_dump(load_config(args.config, args.overrides), sort_keys=False), end="")
    return 0


def _cmd_cache_features(args) -> int:
    from captioner.config import load_config
    from captioner.data.dataset import image_transform
    from captioner.data.feature_cache import build_feature_cache
    from captioner.data.readers import read_split
    from captioner.models.encoder import EncoderConfig, build_encoder
    from captioner.utils import resolve_device

    config = load_config(args.config, args.overrides)
    folder = args.out or config["data"]["features"]
    if not folder:
        raise CaptionerError("cache-features: set data.features in the config (or pass --out DIR)")
    records = [r for split in args.splits for r in read_split(config["data"], split)]
    encoder = build_encoder(EncoderConfig(**config["encoder"])).to(resolve_device(config["run"]["device"]))
    result = build_feature_cache(encoder, records, folder, transform=image_transform(encoder),
                                 batch_size=args.batch_size, num_workers=config["data"]["num_workers"],
                                 max_pixels=config["data"]["max_pixels"], dtype=args.dtype, encoder_config=config["encoder"])
    print(f"{folder}: {result['written']} images written, {result['skipped']} already cached, "
          f"{len(result['failed'])} unreadable")
    for image_id, reason in result["failed"].items():
        print(f"  unreadable (id {image_id}): {reason}", file=sys.stderr)
    return 0


def _cmd_train(args) -> int:
    from captioner.config import load_config
    from captioner.training.engine import train

    overrides = (list(args.overrides) + (["train.wandb=disabled"] if args.no_wandb else [])
                 + (["data.strict=true"] if args.strict else []))
    config = load_config(args.config, overrides)
    result = train(config, resume=args.resume, overwrite=args.overwrite)
    print(json.dumps(result, indent=2))
    return 130 if result["stopped"] else 0


def _config_overrides(args) -> dict:
    """``section.key=value`` arguments (and ``--instances FILE`` for the split) as ``{section: {key: value}}``."""
    from captioner.config import parse_override

    overrides: dict = {}
    for text in args.overrides:
        for section, values in parse_override(text).items():
            overrides.setdefault(section, {}).update(values)
    if getattr(args, "instances", None):
        overrides.setdefault("data", {})["instances"] = {args.split: args.instances}
    return overrides


def _cmd_evaluate(args) -> int:
    from captioner.evaluation.evaluate import evaluate_checkpoint

    scores = evaluate_checkpoint(args.checkpoint, args.split, beam_size=args.beam, out_dir=args.out,
                                 config_overrides=_config_overrides(args), device=args.device, spice=args.spice)
    print(json.dumps(scores, indent=2))
    return 0


def _cmd_ground(args) -> int:
    from captioner.evaluation.evaluate import ground_checkpoint
    from captioner.evaluation.grounding import format_grounding

    grounding = ground_checkpoint(args.checkpoint, args.split, beam_size=args.beam, out_dir=args.out,
                                  config_overrides=_config_overrides(args), device=args.device)
    print(json.dumps(grounding, indent=2) if args.json else format_grounding(grounding))
    return 0


def _load(checkpoint: str, device: str):
    from captioner.training.checkpoint import load_model
    from captioner.utils import resolve_device

    return load_model(checkpoint, resolve_device(device))


def _cmd_caption(args) -> int:
    from captioner.inference import caption_files

    model, vocab, config, _ = _load(args.checkpoint, args.device)
    results = caption_files(model, vocab, args.images, beam_size=args.beam, max_length=config["decode"]["max_length"],
                            length_penalty=config["decode"]["length_penalty"],
                            max_pixels=args.max_pixels or config["data"]["max_pixels"])
    for result in results:
        if result.error:
            print(f"captioner: error: {result.error}", file=sys.stderr)
        elif args.json:
            print(json.dumps({"image": str(result.path), "caption": result.caption,
                              "log_prob": round(result.generation.log_prob, 4)}))
        else:
            print(f"{result.path}: {result.caption}")
    return 1 if any(r.error for r in results) else 0


def _cmd_attend(args) -> int:
    from captioner.data.images import load_image
    from captioner.inference import attention_maps, caption_files
    from captioner.visualisation.attention_figure import draw_attention_figure

    model, vocab, config, _ = _load(args.checkpoint, args.device)
    max_pixels = args.max_pixels or config["data"]["max_pixels"]
    (result,) = caption_files(model, vocab, [args.image], beam_size=args.beam, max_length=config["decode"]["max_length"],
                              length_penalty=config["decode"]["length_penalty"], max_pixels=max_pixels)
    if result.error:
        raise CaptionerError(result.error)
    grid = model.encoder.grid
    alpha = attention_maps(result.generation, grid, "alpha")
    chosen = attention_maps(result.generation, grid, "chosen")
    image = load_image(args.image, max_pixels=max_pixels)
    boxes = None
    if args.instances:
        from captioner.evaluation.grounding import boxes_of_named_objects

        boxes = boxes_of_named_objects(args.instances, args.image, result.words)
    path = draw_attention_figure(image, result.words, alpha.numpy(), args.out, boxes=boxes,
                                 chosen=None if chosen is None else chosen.numpy(), title=result.caption)
    print(f"{args.image}: {result.caption}\nwrote {path}")
    return 0


def _cmd_compare(args) -> int:
    from captioner.visualisation.report import write_report

    result = write_report(args.runs, args.out, split=args.split, beam_size=args.beam, images=args.images)
    print(f"wrote {result['markdown']} and {result['html']}")
    return 0


def _cmd_demo(args) -> int:
    from captioner.demo import run_demo

    run_demo(Path(args.out), data_dir=Path(args.data), fast=args.fast)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner", description="Show, Attend and Tell image captioning.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    data = sub.add_parser("data", help="make or prepare datasets")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="DATASET")
    shapes = data_sub.add_parser("shapes", help="generate the synthetic shapes dataset (COCO format)")
    shapes.add_argument("--out", required=True, help="output folder")
    shapes.add_argument("--seed", type=int, default=0)
    shapes.add_argument("--images", type=int, default=3000, help="number of images (all splits)")
    shapes.add_argument("--image-size", type=int, default=128)
    shapes.set_defaults(func=_cmd_data_shapes)
    vocab = data_sub.add_parser("vocab", help="build the vocabulary of a config's train split and report its coverage")
    vocab.add_argument("config")
    vocab.add_argument("overrides", nargs="*", help="section.key=value, e.g. data.vocab_min_count=3")
    vocab.add_argument("--out", help="vocabulary file to write (default: data.vocab)")
    vocab.set_defaults(func=_cmd_data_vocab)

    config = sub.add_parser("config", help="print a resolved config (defaults, file, overrides) or the reference")
    config.add_argument("config", nargs="?", help="YAML config (default: the built-in defaults)")
    config.add_argument("overrides", nargs="*", help="section.key=value")
    config.add_argument("--reference", action="store_true", help="every setting, its default and meaning (Markdown)")
    config.set_defaults(func=_cmd_config)

    cache = sub.add_parser("cache-features", help="run the frozen encoder once and store region features")
    cache.add_argument("config")
    cache.add_argument("overrides", nargs="*", help="section.key=value")
    cache.add_argument("--splits", nargs="+", default=["train", "val", "test"])
    cache.add_argument("--out", help="cache folder (default: data.features)")
    cache.add_argument("--batch-size", type=int, default=32)
    cache.add_argument("--dtype", choices=["float16", "float32"], default="float16",
                       help="precision of the stored features (float16 halves the disk and page-cache footprint)")
    cache.set_defaults(func=_cmd_cache_features)

    train = sub.add_parser("train", help="train a captioner")
    train.add_argument("config")
    train.add_argument("overrides", nargs="*", help="section.key=value, e.g. model.attention_dim=256")
    train.add_argument("--resume", action="store_true", help="continue the run in run.out from last.pt")
    train.add_argument("--overwrite", action="store_true", help="replace an existing run in run.out")
    train.add_argument("--no-wandb", action="store_true", help="disable wandb logging")
    train.add_argument("--strict", action="store_true", help="stop at the first unreadable or missing image "
                       "instead of skipping it (data.strict)")
    train.set_defaults(func=_cmd_train)

    evaluate = sub.add_parser("evaluate", help="score a checkpoint on a split (BLEU, METEOR, ROUGE-L, CIDEr)")
    evaluate.add_argument("checkpoint")
    evaluate.add_argument("overrides", nargs="*", help="config overrides, e.g. data.features=null")
    evaluate.add_argument("--split", default="test")
    evaluate.add_argument("--beam", type=int, default=None, help="beam size (default: the config's decode.beam)")
    evaluate.add_argument("--out", help="folder for captions_SPLIT.json and scores_SPLIT.json")
    evaluate.add_argument("--spice", action="store_true", help="also SPICE (needs Stanford CoreNLP)")
    evaluate.add_argument("--device", default="auto")
    evaluate.set_defaults(func=_cmd_evaluate)

    ground = sub.add_parser("ground", help="measure whether attention falls on the named objects (shapes data)")
    ground.add_argument("checkpoint")
    ground.add_argument("overrides", nargs="*", help="config overrides, e.g. data.features=null")
    ground.add_argument("--instances", help="COCO instances_*.json of the split (default: the config's data.instances)")
    ground.add_argument("--split", default="test")
    ground.add_argument("--beam", type=int, default=None, help="beam size (default: the config's decode.beam)")
    ground.add_argument("--out", help="folder for grounding_SPLIT.json (default: the checkpoint's folder)")
    ground.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    ground.add_argument("--device", default="auto")
    ground.set_defaults(func=_cmd_ground)

    caption = sub.add_parser("caption", help="caption image files")
    caption.add_argument("images", nargs="+")
    caption.add_argument("--checkpoint", required=True)
    caption.add_argument("--beam", type=int, default=3)
    caption.add_argument("--json", action="store_true", help="one JSON object per line")
    caption.add_argument("--device", default="auto")
    caption.add_argument("--max-pixels", type=int, default=None, help="refuse larger images before decoding them "
                       "(default: the checkpoint's data.max_pixels, 64 megapixels)")
    caption.set_defaults(func=_cmd_caption)

    attend = sub.add_parser("attend", help="draw where the model looked for each word")
    attend.add_argument("image")
    attend.add_argument("--checkpoint", required=True)
    attend.add_argument("--out", required=True, help="output PNG")
    attend.add_argument("--instances", help="COCO instances_*.json holding this image (matched by file name): "
                        "outline the ground-truth box of each object a word names")
    attend.add_argument("--beam", type=int, default=3)
    attend.add_argument("--device", default="auto")
    attend.add_argument("--max-pixels", type=int, default=None, help="refuse larger images before decoding them "
                       "(default: the checkpoint's data.max_pixels, 64 megapixels)")
    attend.set_defaults(func=_cmd_attend)

    compare = sub.add_parser("compare", help="report comparing runs: metrics, curves, attention statistics, figures")
    compare.add_argument("runs", nargs="+", help="run directories (with best.pt or last.pt)")
    compare.add_argument("--out", required=True, help="folder for report.md, report.html and the PNGs")
    compare.add_argument("--split", default="test")
    compare.add_argument("--beam", type=int, default=3)
    compare.add_argument("--images", type=int, default=3, help="test images shown for every run")
    compare.set_defaults(func=_cmd_compare)

    demo = sub.add_parser("demo", help="the main job on the embedded shapes data: generate, train, evaluate, draw")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--data", default="data/shapes")
    demo.add_argument("--fast", action="store_true", help="a tiny run that only checks the pipeline")
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except CaptionerError as err:
        if args.debug:
            raise
        print(f"captioner: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # an unwritable folder, a full disk: the file and the reason, no traceback
        if args.debug:
            raise
        where = f"{err.filename}: " if err.filename else ""
        print(f"captioner: error: {where}{err.strerror or err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("captioner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
