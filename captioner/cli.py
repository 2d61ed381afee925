"""The ``captioner`` command line: data (shapes, vocab, coco), config, cache-features, train, evaluate, ground,
caption, attend, export, compare, serve, demo.

Commands that read a config or a checkpoint take ``section.key=value`` overrides anywhere on the line
(before, between or after the options); every command checks them the same way (an unknown key is an
error naming it). Imports happen inside each command so that ``captioner --help`` and argument errors do
not wait for torch to load (about a second).

User errors (bad files, configs, checkpoints, unwritable folders, full disks) print one line naming the file and what is wrong and exit
with status 1; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
from pathlib import Path

from captioner.errors import CaptionerError
from captioner.export import RUNTIMES
from captioner.version import __version__


def _cmd_data_shapes(args) -> int:
    from captioner.data.shapes import generate_shapes

    summary = generate_shapes(args.out, seed=args.seed, num_images=args.images, image_size=args.image_size)
    print(json.dumps(summary, indent=2, default=str))
    return 0


def _cmd_data_vocab(args) -> int:
    from captioner.config import load_config
    from captioner.data.vocabulary import vocabulary_report

    config = load_config(args.config, args.overrides)
    print(json.dumps(vocabulary_report(config.data, args.out), indent=2))
    return 0


def _cmd_data_coco(args) -> int:
    from captioner.data.coco_setup import format_summary, setup_coco

    result = setup_coco(args.root, year=args.year, split=args.split, keep_zips=args.keep_zips,
                        karpathy_file=args.karpathy_file)
    print(format_summary(result))
    return 0


def _cmd_config(args) -> int:
    import yaml

    from captioner.config import RECIPE_DIR, config_reference, load_config, recipe_summary, recipes

    if args.reference:
        print(config_reference(), end="")
        return 0
    if args.list:
        shipped = recipes()
        width = max(map(len, shipped))
        for name, path in shipped.items():
            print(f"{name:<{width}}  {recipe_summary(path)}")
        print(f"\n(in {RECIPE_DIR}; any command that takes a CONFIG takes a recipe's name)")
        return 0
    print(yaml.safe_dump(load_config(args.config, args.overrides).to_dict(), sort_keys=False), end="")
    return 0


def _cmd_cache_features(args) -> int:
    from captioner.config import load_config
    from captioner.feature_extraction import cache_features

    result = cache_features(load_config(args.config, args.overrides), args.splits, args.out,
                            batch_size=args.batch_size, dtype=args.dtype)
    print(f"{result['folder']}: {result['written']} images written, {result['skipped']} already cached, "
          f"{len(result['failed'])} unreadable")
    for image_id, reason in result["failed"].items():
        print(f"  unreadable (id {image_id}): {reason}", file=sys.stderr)
    return 1 if result["failed"] else 0     # as caption and evaluate: the others are cached all the same


def _cmd_train(args) -> int:
    from captioner.config import load_config
    from captioner.training.engine import train

    overrides = (list(args.overrides) + (["train.wandb=disabled"] if args.no_wandb else [])
                 + (["data.strict=true"] if args.strict else []))
    config = load_config(args.config, overrides)
    result = train(config, resume=args.resume, overwrite=args.overwrite)
    print(json.dumps(result, indent=2))
    return 130 if result["stopped"] else 0


def _split_overrides(args) -> list[str]:
    """The command's overrides, with ``--instances FILE`` as the split's ``data.instances``."""
    instances = getattr(args, "instances", None)
    return list(args.overrides) + ([f"data.instances={json.dumps({args.split: instances})}"] if instances else [])


def _cmd_evaluate(args) -> int:
    from captioner.evaluation.evaluate import evaluate_checkpoint

    scores = evaluate_checkpoint(args.checkpoints, args.split, beam_size=args.beam, out_dir=args.out,
                                 overrides=_split_overrides(args), device=args.device, spice=args.spice,
                                 n_best=args.n_best, runtime=args.runtime)
    print(json.dumps(scores, indent=2))
    return _unreadable_exit(scores["unreadable_images"], scores["images"])


def _cmd_ground(args) -> int:
    from captioner.evaluation.evaluate import ground_checkpoint
    from captioner.evaluation.grounding import format_grounding

    grounding = ground_checkpoint(args.checkpoint, args.split, beam_size=args.beam, out_dir=args.out,
                                  overrides=_split_overrides(args), device=args.device, references=args.references)
    print(json.dumps(grounding, indent=2) if args.json else format_grounding(grounding))
    return _unreadable_exit(grounding["unreadable_images"])


def _unreadable_exit(unreadable: list[str], readable: int | None = None) -> int:
    """1, with a closing line, when images were skipped as unreadable (each named in a warning), else 0."""
    if not unreadable:
        return 0
    rest = f"; the results cover the other {readable}" if readable is not None else "; the results cover the others"
    print(f"captioner: {len(unreadable)} unreadable image(s) skipped (named above){rest}", file=sys.stderr)
    return 1


def _predictor(args):
    """The :class:`~captioner.predictor.Predictor` of ``--checkpoint`` (several: an ensemble) with the overrides,
    ``--beam``, ``--n-best`` and ``--max-pixels``."""
    from captioner.predictor import Predictor
    from captioner.utils import resolve_device

    return Predictor.load(args.checkpoint, device=resolve_device(args.device), overrides=args.overrides,
                          beam=args.beam, n_best=getattr(args, "n_best", None), max_pixels=args.max_pixels,
                          runtime=getattr(args, "runtime", "torch"))


def _cmd_caption(args) -> int:
    from captioner.predictor import caption_json

    results = _predictor(args).caption(args.images)
    for result in results:
        if result.error:
            print(f"captioner: error: {result.error}", file=sys.stderr)
        elif args.json:
            print(json.dumps(caption_json(result)))
        else:
            print(f"{result.path}: {result.caption}")
            for beam in result.beams[1:]:
                print(f"    {beam.log_prob:9.3f}  {beam.caption}")
    return 1 if any(r.error for r in results) else 0


def _cmd_attend(args) -> int:
    result = _predictor(args).attend(args.image, args.out, instances=args.instances)
    print(f"{args.image}: {result.caption}\nwrote {args.out}")
    return 0


def _cmd_export(args) -> int:
    from captioner.export.package import export_checkpoint

    result = export_checkpoint(args.checkpoint, args.out, dtype=args.dtype, onnx=args.onnx, overrides=args.overrides,
                               overwrite=args.overwrite)
    print(f"exported {args.checkpoint} to {result['folder']}:")
    for name, size in result["files"].items():
        print(f"  {name:<20} {size:>13,} bytes")
    print(f"caption with: captioner caption IMAGE --checkpoint {result['folder']}"
          + (" [--runtime onnx]" if args.onnx else "") + f"; in Python: Predictor.load({result['folder']!r})")
    return 0


def _cmd_compare(args) -> int:
    from captioner.report import write_report

    result = write_report(args.runs, args.out, split=args.split, beam_size=args.beam, images=args.images)
    print(f"wrote {result['markdown']} and {result['html']}")
    return 0


def _cmd_serve(args) -> int:
    from captioner.serve.access import TOKEN_VARIABLE
    from captioner.serve.app import serve

    serve(args.checkpoints, host=args.host, port=args.port, device=args.device, overrides=args.overrides,
          beam=args.beam, max_pixels=args.max_pixels, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
          max_upload_mb=args.max_upload_mb, decode_in=args.decode_in, max_queue=args.max_queue,
          timeout_s=args.timeout_s, allow_hosts=args.allow_host, cors_origins=args.cors_origin,
          token=args.token if args.token is not None else os.environ.get(TOKEN_VARIABLE))
    return 0


def _cmd_demo(args) -> int:
    from captioner.demo import DEMO_RUNS, run_demo

    run_demo(Path(args.out), data_dir=Path(args.data), fast=args.fast, runs=tuple(args.runs or DEMO_RUNS),
             seed=args.seed, processes=args.processes, resume=args.resume)
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {value}")
    return value


class _Once(argparse.Action):
    """An option that may be given once: a second value is an error, not silently the one used."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest) is not None:
            parser.error(f"argument {option_string}: given twice")
        setattr(namespace, self.dest, values)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 (any free port) to 65535, not {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:      # NaN too
        raise argparse.ArgumentTypeError(f"must be at least 0, not {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


CONFIG_HELP = "a YAML config, or the name of a recipe that ships with captioner (captioner config --list)"
RUNTIME_HELP = ("torch (default), or onnx: ONNX Runtime over the graphs of an export folder made with --onnx "
                "(captioner export)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="captioner", description="Show, Attend and Tell image captioning.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--version", action="version", version=f"captioner {__version__}",
                        help="print captioner's version and exit")
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
    vocab.add_argument("config", help=CONFIG_HELP)
    vocab.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides, e.g. data.vocab_min_count=3")
    vocab.add_argument("--out", help="vocabulary file to write (default: data.vocab)")
    vocab.set_defaults(func=_cmd_data_vocab)

    coco = data_sub.add_parser("coco", help="download and prepare MS-COCO for configs/coco_*.yaml: images, "
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
    coco.set_defaults(func=_cmd_data_coco)

    config = sub.add_parser("config", help="print a resolved config (defaults, file, overrides), the reference or "
                            "the packaged recipes")
    config.add_argument("config", nargs="?", help="YAML config or a recipe's name (default: the built-in defaults)")
    config.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides of the config")
    config.add_argument("--reference", action="store_true", help="every setting, its default and meaning (Markdown)")
    config.add_argument("--list", action="store_true", help="the recipes that ship with captioner, by name (every "
                        "command that takes a CONFIG takes a name: captioner train coco_soft)")
    config.set_defaults(func=_cmd_config)

    cache = sub.add_parser("cache-features", help="run the frozen encoder once and store region features")
    cache.add_argument("config", help=CONFIG_HELP)
    cache.add_argument("overrides", nargs="*", metavar="section.key=value", help="overrides of the config")
    cache.add_argument("--splits", nargs="+", default=["train", "val", "test"])
    cache.add_argument("--out", help="cache folder (default: data.features)")
    cache.add_argument("--batch-size", type=_positive_int, default=32)
    cache.add_argument("--dtype", choices=["float16", "float32"], default="float16",
                       help="precision of the stored features (float16 halves the disk and page-cache footprint)")
    cache.set_defaults(func=_cmd_cache_features)

    train = sub.add_parser("train", help="train a captioner")
    train.add_argument("config", help=CONFIG_HELP)
    train.add_argument("overrides", nargs="*", metavar="section.key=value",
                       help="overrides, e.g. model.lstm.attention_dim=256 (anywhere on the line)")
    train.add_argument("--resume", action="store_true", help="continue the run in run.out from last.pt")
    train.add_argument("--overwrite", action="store_true", help="replace an existing run in run.out")
    train.add_argument("--no-wandb", action="store_true", help="disable wandb logging")
    train.add_argument("--strict", action="store_true", help="stop at the first unreadable or missing image "
                       "instead of skipping it (data.strict)")
    train.set_defaults(func=_cmd_train)

    evaluate = sub.add_parser("evaluate", help="score a checkpoint (several: an ensemble) on a split (BLEU, METEOR, "
                              "ROUGE-L, CIDEr, diversity, attention)")
    evaluate.add_argument("checkpoints", nargs="+", metavar="checkpoint")
    evaluate.add_argument("overrides", nargs="*", metavar="section.key=value",
                          help="overrides of the checkpoint's config, e.g. data.features=null")
    evaluate.add_argument("--split", default="test")
    evaluate.add_argument("--beam", type=int, default=None, help="beam size (default: the config's decode.beam)")
    evaluate.add_argument("--n-best", type=int, default=None, help="also write the N best captions of every image "
                          "with their log-probabilities (nbest_SPLIT.json)")
    evaluate.add_argument("--out", help="folder for captions_SPLIT.json and scores_SPLIT.json")
    evaluate.add_argument("--spice", action="store_true", help="also SPICE (needs Stanford CoreNLP)")
    evaluate.add_argument("--device", default="auto")
    evaluate.add_argument("--runtime", choices=RUNTIMES, default="torch", help=RUNTIME_HELP)
    evaluate.set_defaults(func=_cmd_evaluate)

    ground = sub.add_parser("ground", help="measure whether attention falls on the named objects (shapes data)")
    ground.add_argument("checkpoint")
    ground.add_argument("overrides", nargs="*", metavar="section.key=value",
                          help="overrides of the checkpoint's config, e.g. data.features=null")
    ground.add_argument("--instances", help="COCO instances_*.json of the split (default: the config's data.instances)")
    ground.add_argument("--split", default="test")
    ground.add_argument("--beam", type=int, default=None, help="beam size (default: the config's decode.beam)")
    ground.add_argument("--out", help="folder for grounding_SPLIT.json (default: the checkpoint's folder)")
    ground.add_argument("--references", action="store_true", help="ground the attention the model pays while it "
                        "reads the split's reference captions, not its own captions")
    ground.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    ground.add_argument("--device", default="auto")
    ground.set_defaults(func=_cmd_ground)

    caption = sub.add_parser("caption", help="caption image files")
    caption.add_argument("images", nargs="+")
    caption.add_argument("--checkpoint", required=True, action="append",
                         help="a trained checkpoint or export folder; give it several times for an ensemble (one "
                              "vocabulary and encoder)")
    caption.add_argument("overrides", nargs="*", metavar="section.key=value",
                         help="overrides of the checkpoint's config, e.g. decode.max_length=16")
    caption.add_argument("--beam", type=int, default=None, help="beam size (default: the config's decode.beam)")
    caption.add_argument("--n-best", type=int, default=None, help="the N best captions of each image, with their "
                         "log-probabilities (default: the config's decode.n_best, 1)")
    caption.add_argument("--json", action="store_true", help="one JSON object per line (with per-word attention)")
    caption.add_argument("--device", default="auto")
    caption.add_argument("--max-pixels", type=_positive_int, default=None,
                         help="refuse larger images before decoding them "
                              "(default: the checkpoint's data.max_pixels, 64 megapixels)")
    caption.add_argument("--runtime", choices=RUNTIMES, default="torch", help=RUNTIME_HELP)
    caption.set_defaults(func=_cmd_caption)

    attend = sub.add_parser("attend", help="draw where the model looked for each word")
    attend.add_argument("image")
    attend.add_argument("--checkpoint", required=True, action=_Once, help="the trained checkpoint or export folder (one)")
    attend.add_argument("--out", required=True, help="output PNG")
    attend.add_argument("--instances", help="COCO instances_*.json holding this image (matched by file name): "
                        "outline the ground-truth box of each object a word names")
    attend.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="overrides of the checkpoint's config, e.g. decode.max_length=16")
    attend.add_argument("--beam", type=int, default=None, help="beam size (default: the config's decode.beam)")
    attend.add_argument("--device", default="auto")
    attend.add_argument("--max-pixels", type=_positive_int, default=None,
                         help="refuse larger images before decoding them "
                              "(default: the checkpoint's data.max_pixels, 64 megapixels)")
    attend.set_defaults(func=_cmd_attend)

    export = sub.add_parser("export", help="a checkpoint as an inference package: safetensors weights, config.json, "
                            "vocab.json, a model card (README.md); --onnx: ONNX graphs too")
    export.add_argument("checkpoint")
    export.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="overrides of the settings the export keeps, e.g. decode.beam=5")
    export.add_argument("--out", required=True, help="the export folder (new or empty; an earlier export with --overwrite)")
    export.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                        help="of the stored weights; they are loaded into float32 (default: float32, the checkpoint's "
                             "own; float16 halves the file)")
    export.add_argument("--onnx", action="store_true", help="also the encoder, the decoder's initial state and its "
                        "per-word step as ONNX graphs (float32), for ONNX Runtime and other runtimes "
                        "(needs pip install 'captioner[onnx]')")
    export.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")
    export.set_defaults(func=_cmd_export)

    compare = sub.add_parser("compare", help="report comparing runs: metrics, curves, attention statistics, figures")
    compare.add_argument("runs", nargs="+", help="run directories (with best.pt or last.pt) or export folders; a run whose "
                         "scores_SPLIT.json is not its checkpoint's with these decode settings is evaluated again, "
                         "which writes captions_SPLIT.json and scores_SPLIT.json into its folder as evaluate does")
    compare.add_argument("--out", required=True, help="folder for report.md, report.html and the PNGs")
    compare.add_argument("--split", default="test")
    compare.add_argument("--beam", type=int, default=None, help="beam size (default: each run's decode.beam)")
    compare.add_argument("--images", type=_non_negative_int, default=3,
                         help="images of the split captioned by every run, with attention figures (0: none)")
    compare.set_defaults(func=_cmd_compare)

    serve = sub.add_parser("serve", help="a web page and JSON API: caption uploaded images, explore attention word by word")
    serve.add_argument("checkpoints", nargs="+", metavar="CKPT", help="checkpoints to serve side by side, named by their run")
    serve.add_argument("overrides", nargs="*", metavar="section.key=value",
                       help="overrides of every checkpoint's config, e.g. decode.max_length=16")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    serve.add_argument("--port", type=_port, default=8000)
    serve.add_argument("--beam", type=_positive_int, default=None, help="beam size when a request names none "
                       "(default: each config's decode.beam)")
    serve.add_argument("--device", default="auto")
    serve.add_argument("--max-batch", type=_positive_int, default=16, help="most images decoded as one batch")
    serve.add_argument("--max-wait-ms", type=_non_negative_float, default=10.0,
                       help="longest a request waits for others to join its batch")
    serve.add_argument("--max-upload-mb", type=_positive_float, default=20.0, help="larger uploads are refused (413)")
    serve.add_argument("--max-pixels", type=_positive_int, default=None,
                         help="refuse larger images before decoding them "
                              "(default: each checkpoint's data.max_pixels, 64 megapixels)")
    serve.add_argument("--decode-in", choices=("process", "thread"), default="process",
                       help="process (default): the models decode in a child process of their own, so that decoding "
                            "never waits for the web server's Python; thread: in the server's own process")
    serve.add_argument("--max-queue", type=_positive_int, default=64,
                       help="most caption and figure requests in the server at once (receiving, waiting, decoding); "
                            "more are refused at once with 503 and Retry-After (default: 64)")
    serve.add_argument("--timeout-s", type=_positive_float, default=30.0,
                       help="a caption or figure request is answered within this many seconds of its headers: past "
                            "it, 408 when its upload had not arrived, else 504 (default: 30)")

    def host_pattern(text: str) -> str:
        name = text.removeprefix("*.")
        if text != "*" and not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*",
                                            name):
            raise argparse.ArgumentTypeError(f"must be a host name (example.org), *.example.org or *, not {text!r}")
        return text

    def origin(text: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
            raise argparse.ArgumentTypeError(f"must be an origin such as http://localhost:3000, not {text!r}")
        return text.rstrip("/")

    serve.add_argument("--allow-host", type=host_pattern, action="append", default=[], metavar="NAME",
                       help="another name the server answers to (repeatable; *.example.org: any under it, *: any); "
                            "requests naming others in their Host header are refused, against DNS rebinding "
                            "(default: localhost, any IP address, and --host when it is a name)")
    serve.add_argument("--token", default=None,
                       help="every API request must carry 'Authorization: Bearer TOKEN'; the page reads it from "
                            "its address, http://HOST:PORT/#token=TOKEN (default: the CAPTIONER_TOKEN environment "
                            "variable, else none: do not listen beyond this machine without one)")
    serve.add_argument("--cors-origin", type=origin, action="append", default=[], metavar="ORIGIN",
                       help="a web origin (http://localhost:3000) whose pages may call the API, with CORS headers "
                            "(repeatable; default: none, and POSTs from other origins are refused)")
    serve.set_defaults(func=_cmd_serve)

    demo = sub.add_parser("demo", help="the main job on the embedded shapes data: generate, train, evaluate, draw")
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--data", default="data/shapes")
    demo.add_argument("--fast", action="store_true", help="a tiny run that only checks the pipeline")
    demo.add_argument("--seed", type=int, default=None, help="every run's run.seed (default: the configs', 0); "
                      "the shapes data stay the same")
    demo.add_argument("--runs", nargs="+", metavar="RUN", help="train only these runs (default: all of soft, "
                      "none, hard, transformer, soft_scst; soft_scst needs soft, trained now or before)")
    demo.add_argument("--processes", type=_positive_int, default=None,
                      help="worker processes the runs train on: soft on all of them, data parallel, "
                           "then the others side by side, one each (default: one per usable CPU core, at most 4; 1 with a GPU); "
                           "1: one after the other in this process")
    demo.add_argument("--resume", action="store_true", help="continue each run from its last.pt where it has one "
                      "(after Ctrl-C: the same result as a demo never stopped) instead of starting it over")
    demo.set_defaults(func=_cmd_demo)
    return parser


OVERRIDE = re.compile(r"^[A-Za-z_]\w*(\.\w+)+=")   # section.key=value (see captioner.config.parse_override)


def is_override(word: str) -> bool:
    """``section.key=value``, unless a file of that name exists (an image called ``shot.v=1.png``)."""
    return bool(OVERRIDE.match(word)) and not os.path.exists(word)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line; ``section.key=value`` words are taken out first, wherever they stand, and
    given to the commands that accept overrides (any other command refuses them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = [word for word in argv if is_override(word)]
    parser = build_parser()
    args = parser.parse_args([word for word in argv if not is_override(word)])
    if overrides:
        if not hasattr(args, "overrides"):
            parser.error(f"'{args.command}' takes no section.key=value overrides (got {overrides[0]})")
        args.overrides = list(args.overrides) + overrides
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from captioner.utils import LOG_FORMAT, keep_freed_memory

    keep_freed_memory()   # decoding in a fresh process as fast as in a warmed-up one (see its docstring)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        code = args.func(args)
        sys.stdout.flush()      # here, so that a reader gone away (| head) is seen below, not at exit
        return code
    except BrokenPipeError:     # the reader of our output has had enough: stop quietly, as a piped tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())    # no second error when Python exits
        return 128 + signal.SIGPIPE
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
