"""The docs' generated reference, made at build time from the code itself (an MkDocs hook, ``hooks:`` in
mkdocs.yml): a page's ``<!-- generated:NAME -->`` line is replaced by

- ``cli``: every command of ``captioner.cli.build_parser()`` with its usage and every argument and option;
- ``config``: every setting of the typed config (``captioner config --reference``);
- ``recipes``: every recipe that ships in ``captioner/configs/``, with what it trains.

So the reference cannot drift from the code: a new option, setting or recipe is in the next build."""

from __future__ import annotations

import argparse
import re

from captioner.cli import build_parser
from captioner.config import config_reference, load_config, recipe_summary, recipes

GENERATED = re.compile(r"^<!-- generated:(?P<name>[a-z]+) -->$", re.M)
USAGE_WIDTH = 72   # characters: the usage lines fit the content column of the page


def cell(text: str) -> str:
    """``text`` fit for a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def commands(parser: argparse.ArgumentParser, names: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str,
                                                                                           argparse.ArgumentParser]]:
    """Every command of ``parser`` that runs something (``data shapes``, not ``data``): (its words, its one-line
    help, its parser), in the order the parser declares them."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                deeper = commands(sub, names + (name,))
                found += deeper or [(names + (name,), helps.get(name) or "", sub)]
    return found


def argument_row(action: argparse.Action) -> str:
    """One argument or option of a command as a table row: how it is written, its default, what it does."""
    if action.option_strings:
        flag = ", ".join(action.option_strings)
        takes = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        written = f"`{flag}{takes}`" + (" ..." if action.nargs in ("+", "*") else "")
    else:
        written = f"`{action.metavar or action.dest}`" + (" ..." if action.nargs in ("+", "*") else "")
    required = action.required and action.option_strings
    shown = " ".join(map(str, action.default)) if isinstance(action.default, list) else str(action.default)
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or not shown:   # `` would show as such
        default = "required" if required else ""
    else:
        default = f"`{shown}`"
    meaning = action.help or ""
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        meaning = (meaning + "; " if meaning else "") + "one of " + ", ".join(f"`{c}`" for c in action.choices)
    if action.nargs in ("*", "?") and not action.option_strings:
        meaning = (meaning + " " if meaning else "") + "(optional)"
    return f"| {written} | {default} | {cell(meaning)} |"


def usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def arguments_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = [argument_row(action) for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))]
    return ["| argument | default | meaning |", "|---|---|---|", *rows] if rows else []


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Every command of the command line (default: ``captioner.cli.build_parser()``) as Markdown: a section per
    command with its one-line help, its usage and a table of its arguments and options."""
    parser = parser or build_parser()
    lines = ["## captioner", "", parser.description or "", "", "```text", usage(parser), "```", "",
             *arguments_table(parser), ""]
    for names, help_text, sub in commands(parser):
        lines += [f"## captioner {' '.join(names)}", "", cell(help_text), "", "```text", usage(sub), "```", "",
                  *arguments_table(sub), ""]
    return "\n".join(lines)


def recipes_table() -> str:
    """Every recipe in ``captioner/configs/`` as a table: its name, the first sentence of its opening comment (cut
    to 160 characters), its decoder, attention and encoder, its epochs and its precision setting."""
    lines = ["| recipe | what it trains | model | epochs | `train.amp` |", "|---|---|---|---|---|"]
    for name, path in recipes().items():
        config = load_config(path)
        if config.train.init_from or (config.train.objective == "scst" and not config.train.scst_after_epoch):
            # it trains a checkpoint it starts from, not a model of its own
            model = "the checkpoint it starts from (`train.init_from`)"
        elif config.model.decoder == "lstm":
            lstm = config.model.lstm
            model = f"LSTM, {lstm.attention_mode} attention ({lstm.attention}), {config.encoder.name}"
        else:
            model = f"{config.model.decoder}, {config.encoder.name}"
        amp = str(config.train.amp).lower()
        lines.append(f"| `{name}` | {cell(recipe_summary(path, width=160))} | {model} | {config.train.epochs} | "
                     f"`{amp}` |")
    return "\n".join(lines) + "\n"


GENERATORS = {"cli": cli_reference, "config": config_reference, "recipes": recipes_table}


def on_page_markdown(markdown: str, **_) -> str:
    """MkDocs hook: each ``<!-- generated:NAME -->`` line of a page becomes the reference it names."""
    return GENERATED.sub(lambda match: GENERATORS[match["name"]](), markdown)
