"""``captioner export --checkpoint CKPT --out DIR``: a checkpoint as an inference package (safetensors weights,
``config.json``, ``vocab.json``, the model card; with ``--onnx`` the ONNX graphs), written by
:func:`captioner.workflows.export.export_checkpoint`."""

from __future__ import annotations

import argparse

from captioner.commands.options import add_checkpoint, add_overrides


def add_parser(commands) -> None:
    parser = commands.add_parser("export", help="a checkpoint as an inference package: safetensors weights, "
                                 "config.json, vocab.json, a model card (README.md); --onnx: ONNX graphs too")
    add_checkpoint(parser, "the trained checkpoint to export (one; a checkpoint file, not an export)",
                   positional=True)
    add_overrides(parser, "overrides of the settings the export keeps, e.g. decode.beam=5")
    parser.add_argument("--out", required=True, help="the export folder (new or empty; an earlier export with "
                        "--overwrite)")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                        help="of the stored weights; they are loaded into float32 (default: float32, the checkpoint's "
                             "own; float16 halves the file)")
    parser.add_argument("--onnx", action="store_true", help="also the encoder, the decoder's initial state and its "
                        "per-word step as ONNX graphs (float32), for ONNX Runtime and other runtimes "
                        "(needs pip install 'captioner[onnx]')")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in --out")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.workflows.export import export_checkpoint

    result = export_checkpoint(args.checkpoint, args.out, dtype=args.dtype, onnx=args.onnx, overrides=args.overrides,
                               overwrite=args.overwrite)
    print(f"exported {args.checkpoint} to {result['folder']}:")
    for name, size in result["files"].items():
        print(f"  {name:<20} {size:>13,} bytes")
    print(f"caption with: captioner caption IMAGE --checkpoint {result['folder']}"
          + (" [--runtime onnx]" if args.onnx else "") + f"; in Python: Predictor.load({result['folder']!r})")
    return 0
