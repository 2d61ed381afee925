"""The version of captioner: ``captioner --version`` prints it, and every checkpoint and export records it
(``captioner_version``), so that a model says which code made it."""

__version__ = "0.2.0"
