"""A checkpoint as an inference package, what ``captioner export --checkpoint CKPT --out DIR`` writes (see
:mod:`captioner.export.folder` for its files): the weights as safetensors in the dtype asked for, ``config.json``,
``vocab.json``, the model card (:mod:`captioner.workflows.model_card`) and, with ``onnx``, the ONNX graphs, built from
the weights as the export stores them (so that ONNX Runtime and a Predictor of the export agree). The folder is written
beside ``DIR`` and renamed into place when complete: a failed export leaves nothing behind, and an earlier export in
``DIR`` is replaced only with ``overwrite``."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from captioner.errors import CaptionerError

log = logging.getLogger(__name__)


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
    from captioner.core.files import UMASK
    from captioner.export.folder import DTYPES, is_export

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
    from captioner.checkpoint import build_checkpoint_model, trained_on
    from captioner.core.files import write_file
    from captioner.export.folder import CARD, read_export, write_config, write_export_files
    from captioner.workflows.model_card import model_card

    regions = {"image_size": list(model.encoder.image_size), "grid": list(model.encoder.grid),
               "feature_dim": model.encoder.feature_dim}
    described = write_export_files(staging, model.state_dict(), vocab.to_dict(), config.to_dict(), dtype=dtype,
                                   trained_with=payload.get("captioner_version"), regions=regions,
                                   trained_on=trained_on(payload, config))
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
