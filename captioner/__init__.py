"""captioner: Show, Attend and Tell image captioning with soft, hard and Transformer attention.

The Python API is :class:`captioner.Predictor` (``from captioner import Predictor``), imported on first use so
that ``import captioner`` stays light."""
from captioner.version import __version__

__all__ = ["Predictor", "__version__"]


def __getattr__(name: str):
    if name == "Predictor":
        from captioner.predictor import Predictor

        return Predictor
    raise AttributeError(f"module 'captioner' has no attribute {name!r}")
