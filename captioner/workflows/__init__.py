"""What a command does end to end, as library functions that scripts, notebooks and tests call as the commands do:
``evaluate`` (decode a split, score it, write the results), ``ground``, ``attend`` (attention figures of image
files), ``export`` (with its ``model_card``), ``report`` (the comparison report of ``captioner compare``) and
``demo`` (the main job of ``captioner demo``). Each :mod:`captioner.commands` module declares its options and calls
one of these in its ``run``.
"""
