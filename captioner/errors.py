"""Errors caused by the user's input (files, configs, checkpoints).

The CLI prints a :class:`CaptionerError` as one line, with no traceback, and exits non-zero.
Every message names the file (or setting) at fault and what is wrong with it.
"""


class CaptionerError(Exception):
    """A user error: a bad file, config value or checkpoint. Printed by the CLI as one line."""


class ImageError(CaptionerError):
    """An image that cannot be used: missing, empty, truncated, not an image, or too large."""
