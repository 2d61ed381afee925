"""Exported models: a trained checkpoint as a folder that other machines and tools load without captioner's
training state and without pickle. This package holds the files' formats, below the config and the checkpoints
that read them; an export is written by :mod:`captioner.workflows.export`, what ``captioner export`` runs
(with the model card, :mod:`captioner.workflows.model_card`).

* :mod:`captioner.export.folder`: the folder's files (safetensors weights, ``config.json``, ``vocab.json``),
  written and read back; :func:`captioner.checkpoint.load_checkpoint` reads an export folder like a checkpoint,
  so every command and :class:`captioner.Predictor` take either;
* :mod:`captioner.export.onnx`: the encoder and the decoder's per-word step as ONNX graphs, and the decode-step
  interface over ONNX Runtime that the one search drives.

This file imports nothing, so that the command line can name the runtimes without importing torch.
"""

RUNTIMES = ("torch", "onnx")
"""What can run a model: torch, or ONNX Runtime over an export's graphs (``Predictor.load(..., runtime=...)``)."""
