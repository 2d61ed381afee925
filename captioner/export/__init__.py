"""Exported models: a trained checkpoint as a folder that other machines and tools load without captioner's
training state and without pickle (``captioner export``).

* :mod:`captioner.export.folder`: the folder's files (safetensors weights, ``config.json``, ``vocab.json``),
  written and read back; :func:`captioner.checkpoint.load_checkpoint` reads an export folder like a checkpoint,
  so every command and :class:`captioner.Predictor` take either;
* :mod:`captioner.commands.model_card`: the model card (``README.md``) generated from the run;
* :mod:`captioner.export.onnx`: the encoder and the decoder's per-word step as ONNX graphs, and the decode-step
  interface over ONNX Runtime that the one search drives;
* :mod:`captioner.commands.export`: ``captioner export`` itself.

This file imports nothing, so that :mod:`captioner.checkpoint` can read export folders without importing the
writers above it, and the command line can name the runtimes without importing torch.
"""

RUNTIMES = ("torch", "onnx")
"""What can run a model: torch, or ONNX Runtime over an export's graphs (``Predictor.load(..., runtime=...)``)."""
