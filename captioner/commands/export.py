"""``captioner export CKPT --out DIR``: a checkpoint as an inference package (see :mod:`captioner.export.folder`
for its files): the weights as safetensors in the dtype asked for, ``config.json``, ``vocab.json``, the model card
(:mod:`captioner.commands.model_card`) and, with ``onnx``, the ONNX graphs, built from the weights as the export
stores them (so that ONNX Runtime and a Predictor of the export agree). The folder is written beside ``DIR`` and
renamed into place when complete: a failed export leaves nothing behind, and an earlier export in ``DIR`` is
replaced only with ``overwrite``."""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from captioner.commands.options import add_overrides
from captioner.errors import CaptionerError

log = logging.getLogger(__name__)


def add_parser(commands) -> None:
    parser = commands.add_parser("export", help="a checkpoint as an inference package: safetensors weights, "
                                 "config.json, vocab.json, a model card (README.md); --onnx: ONNX graphs too")
    parser.add_argument("checkpoint")
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
    result = export_checkpoint(args.checkpoint, args.out, dtype=args.dtype, onnx=args.onnx, overrides=args.overrides,
                               overwrite=args.overwrite)
    print(f"exported {args.checkpoint} to {result['folder']}:")
    for name, size in result["files"].items():
        print(f"  {name:<20} {size:>13,} bytes")
    print(f"caption with: captioner caption IMAGE --checkpoint {result['folder']}"
          + (" [--runtime onnx]" if args.onnx else "") + f"; in Python: Predictor.load({result['folder']!r})")
    return 0


def _check_destination(out: Path, overwrite: bool) -> None:
    """Refuse a destination that holds anything but an earlier export (replaced with ``overwrite`` only)."""
    from captioner.export.folder import is_export

    if not out.exists():
        return
    if not out.is_dir():
        raise CaptionerError(f"{out}: is a file, not a folder")
    if any(out.iterdir()):
        if not is_export(out):
            raise CaptionerError(f"{out}: a folder of other files; export into a new or empty folder")
        if not overwrite:
            raise CaptionerError(f"{out}: holds an export already (--overwrite replaces it)")


def export_checkpoint(checkpoint: str | Path, out: str | Path, *, dtype: str = "float32", onnx: bool = False,
                      overrides: Sequence[str] = (), overwrite: bool = False) -> dict:
    """Export ``checkpoint`` into the folder ``out``; returns ``{"folder", "files": {name: bytes}, "config": the
    config.json written}``. ``overrides`` (``section.key=value``) change the settings the export keeps (decode
    defaults, say), as they would change the checkpoint's for any command."""
    from captioner.checkpoint import build_checkpoint_model, load_checkpoint
    from captioner.export.folder import DTYPES, is_export
    from captioner.utils import UMASK

    checkpoint, out = Path(checkpoint), Path(out)
    if dtype not in DTYPES:
        raise CaptionerError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if is_export(checkpoint):
        raise CaptionerError(f"{checkpoint}: is an export already; export the checkpoint it was made from")
    _check_destination(out, overwrite)
    payload = load_checkpoint(checkpoint)
    model, vocab, config = build_checkpoint_model(payload, checkpoint, overrides)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    staging.chmod(0o777 & ~UMASK)        # a folder to hand on: readable as mkdir makes it, not owner-only
    try:
        described, files = write_package(staging, out.name, model, vocab, config, payload, checkpoint, dtype=dtype,
                                         onnx=onnx)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("%s: exported %s (%s weights%s)", out, checkpoint, dtype, ", ONNX graphs" if onnx else "")
    return {"folder": str(out), "files": files, "config": described}


def write_package(staging: Path, name: str, model, vocab, config, payload: dict, checkpoint: Path, *, dtype: str,
                  onnx: bool) -> tuple[dict, dict[str, int]]:
    """The files of the export ``name`` of ``checkpoint`` (its ``payload``, and the ``model``, ``vocab`` and
    ``config`` built from it) written into ``staging``: ``(the config.json written, {file: bytes})``."""
    from captioner.checkpoint import build_checkpoint_model
    from captioner.commands.model_card import model_card
    from captioner.export.folder import CARD, read_export, write_config, write_export_files
    from captioner.utils import write_file

    regions = {"image_size": list(model.encoder.image_size), "grid": list(model.encoder.grid),
               "feature_dim": model.encoder.feature_dim}
    described = write_export_files(staging, model.state_dict(), vocab.to_dict(), config.to_dict(), dtype=dtype,
                                   trained_with=payload.get("captioner_version"), regions=regions)
    if onnx:
        from captioner.export.onnx import export_onnx, require_onnx

        require_onnx()
        # the graphs of the weights as stored (rounded to dtype), so that both runtimes decode the same model
        stored, _, _ = build_checkpoint_model(read_export(staging), staging)
        stored.encoder.prepare_for_inference()
        described["onnx"] = export_onnx(stored.eval(), staging)
        write_config(staging, described)
    files = {path.name: path.stat().st_size for path in sorted(staging.iterdir())}
    write_file(staging / CARD, model_card(name, described, config, payload.get("progress", {}), checkpoint, files))
    files[CARD] = (staging / CARD).stat().st_size
    return described, files
