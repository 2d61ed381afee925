"""The commands of the ``captioner`` command line, one module each: ``add_parser(commands)`` adds the command's
sub-parser (its options, their defaults and help) to the sub-parsers ``commands``, and ``run(args)`` runs it,
returning the exit status. :func:`captioner.cli.build_parser` assembles them in :data:`COMMANDS`' order.

A command module imports at its top only what ``captioner --help`` can afford (the standard library and
captioner's modules that import nothing heavy); torch and everything that loads it are imported inside the
functions that need them, so that the help and argument errors answer before torch has loaded.
"""
