"""The README cannot drift from the code: its configuration reference is the generated one, its command
table lists every subcommand with every option, and every command it shows parses with the real
command line, settings of its overrides included (config files, scripts, make targets and benchmark
options too). Running the
commands themselves is the job of the other tests (each subcommand has an end-to-end test) and of CI.
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
from captioner.config import Config, apply_overrides, config_reference

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def subcommands(parser: argparse.ArgumentParser, prefix=()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(subcommands(sub, prefix + (name,)) or {prefix + (name,): sub})
    return found


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")} - {"--help"}


def shown_commands() -> list[str]:
    """Every shell command in the README: the lines of its sh blocks and its inline code spans that
    start with a command (continuation lines joined, comments dropped)."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", README, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].split(" # ")[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    starts = ("captioner ", "make ", "python ", "python3 ", "scripts/", "torchrun ", ".venv/bin/")
    commands += [span for span in re.findall(r"`([^`\n]+)`", README) if span.startswith(starts)]
    return commands


def without_optional_parts(tokens: list[str]) -> list[str]:
    text = re.sub(r"\[[^\[\]]*\]", "", " ".join(tokens))
    text = re.sub(r"\[[^\[\]]*\]", "", text)
    return [t for t in text.split() if t not in ("...",)]


def test_configuration_reference_is_the_generated_one():
    start, end = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"
    assert start in README and end in README
    assert README[README.index(start) + len(start):README.index(end)] == config_reference()


def test_command_table_lists_every_subcommand_with_every_option():
    rows = {}
    for cell in re.findall(r"^\| `(captioner [^`]+)` \|", README, flags=re.M):
        words = cell.split()
        for names in subcommands(build_parser()):
            if tuple(words[1 : 1 + len(names)]) == names:
                rows[names] = cell
    missing = [" ".join(n) for n in subcommands(build_parser()) if n not in rows]
    assert not missing, f"README command table lacks: {missing}"
    for names, parser in subcommands(build_parser()).items():
        shown = set(re.findall(r"--[a-z][a-z-]*", rows[names]))
        assert shown == options(parser), f"captioner {' '.join(names)}: README {sorted(shown)} vs code {sorted(options(parser))}"


def captioner_arguments(command: str) -> list[str] | None:
    """The arguments after ``captioner`` (``captioner``, ``.venv/bin/captioner``, ``-m captioner``), or None."""
    tokens = shlex.split(command)
    for i, token in enumerate(tokens):
        if token == "captioner" or token.endswith("/captioner"):
            return tokens[i + 1 :]
    return None


@pytest.mark.parametrize("command", [c for c in shown_commands() if captioner_arguments(c) is not None])
def test_every_captioner_command_shown_parses(command):
    arguments = [("train" if a == "COMMAND" else a) for a in without_optional_parts(captioner_arguments(command))]
    if len(arguments) == 1 and not arguments[0].startswith("-"):  # a command named in the prose: it must exist
        assert (arguments[0],) in {names[:1] for names in subcommands(build_parser())}, f"no command {command}"
        return
    try:
        args = parse_args(arguments)
    except SystemExit as stop:
        if stop.code != 0 or not {"--help", "--version"} & set(arguments):  # they exit 0 after printing
            pytest.fail(f"README command does not parse: {command}")
        return
    apply_overrides(Config(), getattr(args, "overrides", []))  # every setting shown exists
    for token in arguments:
        if token.endswith(".yaml"):
            assert (ROOT / token).is_file(), f"{command}: no {token}"


# Prints {script: what `python script --help` prints} for the scripts named in argv, all in one process (torch
# imported once, not once per script), each run as __main__ with its folder first on sys.path.
HELP_OF_EACH = """
import contextlib, io, json, runpy, sys
from pathlib import Path
printed = {}
for script in sys.argv[1:]:
    sys.argv, buffer = [script, "--help"], io.StringIO()
    sys.path.insert(0, str(Path(script).parent))
    with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
        runpy.run_path(script, run_name="__main__")
    sys.path.pop(0)
    printed[script] = buffer.getvalue()
json.dump(printed, sys.__stdout__)
"""


def help_of_each(scripts: list[str]) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", HELP_OF_EACH, *scripts], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_script_make_target_and_benchmark_shown_exists():
    makefile = (ROOT / "Makefile").read_text()
    benchmarks = sorted({tokens[1] for tokens in map(shlex.split, shown_commands())
                         if tokens[0] in ("python", "python3") and tokens[1].startswith("benchmarks/")})
    for script in benchmarks:
        assert (ROOT / script).is_file(), script
    help_text = help_of_each(benchmarks)
    for command in shown_commands():
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
            assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, command
        elif tokens[0] in ("python", "python3") and tokens[1].startswith("benchmarks/"):
            script = tokens[1]
            assert help_text[script], f"{script} --help printed nothing"
            for flag in re.findall(r"--[a-z][a-z-]*", " ".join(without_optional_parts(tokens[2:])) + " "
                                   + " ".join(re.findall(r"\[(--[a-z-]+)", command))):
                assert flag in help_text[script], f"{command}: {script} has no {flag}"


def test_every_figure_shown_is_a_small_committed_png():
    figures = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", README)
    assert figures, "the README shows no figure"
    tracked = subprocess.run(["git", "ls-files", *figures], capture_output=True, text=True, cwd=ROOT).stdout.split()
    for figure in figures:
        path = ROOT / figure
        assert path.is_file(), f"README figure {figure} does not exist"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{figure} is not a PNG"
        assert path.stat().st_size < 300_000, f"{figure} is {path.stat().st_size} bytes; keep README figures small"
        if (ROOT / ".git").exists():
            assert figure in tracked, f"{figure} is not committed"
