"""The README and the docs cannot drift from the code: every command they show, in the README and in every page
under docs/, parses with the real command line (`captioner.cli.build_parser()`), settings of its overrides
included (config files, scripts, make targets and benchmark options too), and every figure they show is a small
committed PNG. The command-line and configuration references are generated from the code when the docs are built
(tests/test_docs.py). Running the commands themselves is the job of the other tests (each subcommand has an
end-to-end test) and of CI.
"""

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from captioner.cli import build_parser, parse_args
from captioner.config import Config, apply_overrides

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def subcommands(parser: argparse.ArgumentParser, prefix=()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(subcommands(sub, prefix + (name,)) or {prefix + (name,): sub})
    return found


def shown_commands(text: str) -> list[str]:
    """Every shell command in a page: the lines of its sh blocks and its inline code spans that start with a
    command (continuation lines joined, comments dropped)."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].split(" # ")[0].strip()
            if line and not line.startswith("#"):
                commands += [command.strip() for command in line.split("&&")]   # each command of a chain
    starts = ("captioner ", "make ", "python ", "python3 ", "scripts/", "torchrun ", ".venv/bin/")
    commands += [span for span in re.findall(r"`([^`\n]+)`", text) if span.startswith(starts)]
    return commands


def every_shown_command() -> list[tuple[str, str]]:
    """(page, command) for every command shown in the README and the docs pages."""
    return [(str(page.relative_to(ROOT)), command) for page in PAGES for command in shown_commands(page.read_text())]


def without_optional_parts(tokens: list[str]) -> list[str]:
    text = re.sub(r"\[[^\[\]]*\]", "", " ".join(tokens))
    text = re.sub(r"\[[^\[\]]*\]", "", text)
    return [t for t in text.split() if t not in ("...",)]


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def captioner_arguments(command: str) -> list[str] | None:
    """The arguments after ``captioner`` (``captioner``, ``.venv/bin/captioner``, ``-m captioner``), or None."""
    tokens = shlex.split(command)
    for i, token in enumerate(tokens):
        if token == "captioner" or token.endswith("/captioner"):
            return tokens[i + 1 :]
    return None


@pytest.mark.parametrize("page,command", [(page, command) for page, command in every_shown_command()
                                          if captioner_arguments(command) is not None])
def test_every_captioner_command_shown_parses(page, command, capsys):
    arguments = [("train" if a == "COMMAND" else a) for a in without_optional_parts(captioner_arguments(command))]
    if not arguments:                                            # the command itself named in the prose
        return
    commands = subcommands(build_parser())
    words = next((arguments[:i] for i, a in enumerate(arguments) if a.startswith("-")), arguments)
    named = [names for names in commands if names[: len(words)] == tuple(words)]
    if words and named and all(a.startswith("-") for a in arguments[len(words):]):
        # a command named in the prose (`captioner data`, `captioner caption --json`): it exists, with those options
        if len(arguments) > len(words):
            assert len(named) == 1, f"{page}: {command}: options of which command?"
            unknown = set(arguments[len(words):]) - options(commands[named[0]])
            assert not unknown, f"{page}: {command}: no option {sorted(unknown)}"
        return
    try:
        args = parse_args(arguments)
    except SystemExit as stop:
        if stop.code != 0 or not {"--help", "--version"} & set(arguments):  # they exit 0 after printing
            pytest.fail(f"{page}: command does not parse: {command}")
        return
    assert "deprecated" not in capsys.readouterr().err, f"{page}: {command}: an old form of the line"
    apply_overrides(Config(), getattr(args, "overrides", []))  # every setting shown exists
    for token in arguments:
        if token.endswith(".yaml"):
            assert (ROOT / token).is_file(), f"{page}: {command}: no {token}"


# Prints {name: what `python script [subcommand] --help` prints} for the names in argv (``script`` or
# ``script subcommand``), all in one process (torch imported once, not once per script), each run as __main__ with
# its folder first on sys.path.
HELP_OF_EACH = """
import contextlib, io, json, runpy, sys
from pathlib import Path
printed = {}
for name in sys.argv[1:]:
    script, *subcommand = name.split()
    sys.argv, buffer = [script, *subcommand, "--help"], io.StringIO()
    sys.path.insert(0, str(Path(script).parent))
    with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
        runpy.run_path(script, run_name="__main__")
    sys.path.pop(0)
    printed[name] = buffer.getvalue()
json.dump(printed, sys.__stdout__)
"""


def help_of_each(scripts: list[str]) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", HELP_OF_EACH, *scripts], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_script_make_target_and_benchmark_shown_exists():
    makefile = (ROOT / "Makefile").read_text()
    commands = [command for _, command in every_shown_command()]
    python_scripts = sorted({tokens[1] for tokens in map(shlex.split, commands)
                             if tokens[0] in ("python", "python3") and tokens[1].startswith(("benchmarks/", "scripts/"))})
    for script in python_scripts:
        assert (ROOT / script).is_file(), script
    help_text = help_of_each(python_scripts)
    # a script of subcommands ({snr,decode,runs} in its usage): the options are those of the subcommand shown
    subcommands = sorted({f"{tokens[1]} {tokens[2]}" for tokens in map(shlex.split, commands)
                          if tokens[0] in ("python", "python3") and tokens[1] in help_text and len(tokens) > 2
                          and re.search(rf"{{[\w,-]*\b{re.escape(tokens[2])}\b[\w,-]*}}", help_text[tokens[1]])})
    help_text |= help_of_each(subcommands) if subcommands else {}
    for command in commands:
        tokens = shlex.split(command)
        if tokens[0] == "make":
            for target in tokens[1:]:
                if "=" in target:                       # a variable the Makefile reads: make setup INSTALLER=pip
                    name = target.split("=")[0]
                    assert re.search(rf"^{re.escape(name)} \??=", makefile, flags=re.M), f"no make variable {name}"
                    continue
                assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), f"no make target {target}"
        elif tokens[0].startswith("scripts/"):
            script = ROOT / tokens[0]
            assert script.is_file(), command
            if script.suffix == ".sh":
                assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, command
        elif tokens[0] in ("python", "python3") and tokens[1].startswith(("benchmarks/", "scripts/")):
            script = f"{tokens[1]} {tokens[2]}" if f"{tokens[1]} {tokens[2] if len(tokens) > 2 else ''}" in help_text \
                else tokens[1]
            assert help_text[script], f"{script} --help printed nothing"
            for flag in re.findall(r"--[a-z][a-z-]*", " ".join(without_optional_parts(tokens[2:])) + " "
                                   + " ".join(re.findall(r"\[(--[a-z-]+)", command))):
                assert flag in help_text[script], f"{command}: {script} has no {flag}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_figure_shown_is_a_small_committed_png(page):
    figures = [(page.parent / figure).resolve().relative_to(ROOT).as_posix()
               for figure in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text())]
    tracked = subprocess.run(["git", "ls-files", *figures], capture_output=True, text=True, cwd=ROOT).stdout.split()
    for figure in figures:
        path = ROOT / figure
        assert path.is_file(), f"{page.name}: figure {figure} does not exist"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{figure} is not a PNG"
        assert path.stat().st_size < 300_000, f"{figure} is {path.stat().st_size} bytes; keep figures small"
        if (ROOT / ".git").exists():
            assert figure in tracked, f"{figure} is not committed"


def test_the_readme_shows_a_figure():
    assert re.search(r"!\[[^\]]*\]\(docs/[^)\s]+\.png\)", (ROOT / "README.md").read_text())
