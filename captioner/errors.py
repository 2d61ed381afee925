"""Errors caused by the user's input (files, configs, checkpoints).

The CLI prints a :class:`CaptionerError` as one line, with no traceback, and exits non-zero.
Every message names the file (or setting) at fault and what is wrong with it.
"""


def first_line(error: object, typed: bool = False) -> str:
    """The first line of ``str(error)``, stripped, for a one-line message (``typed``: after the exception's type
    name); the type name alone when it says nothing."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    return f"{type(error).__name__}: {text.splitlines()[0]}" if typed else text.splitlines()[0]


class CaptionerError(Exception):
    """A user error: a bad file, config value or checkpoint. Printed by the CLI as one line."""


class ImageError(CaptionerError):
    """An image that cannot be used: missing, empty, truncated, not an image, or too large."""
