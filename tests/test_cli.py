"""The command line's one language: the checkpoint is `--checkpoint PATH` for every command (its old positional form
taken with a notice for this release), missing arguments are said in words, bare `captioner` lists its commands,
`attend` draws several images, and every argument of every command has a help line."""

import argparse

import pytest

from captioner.cli import build_parser, main, parse_args

NOTICE = "captioner: the checkpoint as a positional argument is deprecated; give it as --checkpoint PATH"

CHECKPOINT_COMMANDS = {     # command: (what it takes besides the checkpoint, whether several checkpoints make sense)
    "evaluate": ([], True), "ground": ([], False), "export": (["--out", "x"], False), "serve": ([], True),
    "caption": (["a.png"], True), "attend": (["a.png", "--out", "f.png"], False),
}


def undescribed(parser: argparse.ArgumentParser, names=()) -> list[str]:
    """``captioner COMMAND ARGUMENT`` for each argument or option without a help line (``captioner data`` aside)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                if (*names, name)[:1] != ("data",):
                    found += undescribed(command, (*names, name))
        elif not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            found.append(" ".join(("captioner", *names, "/".join(action.option_strings) or action.dest)))
    return found


def test_every_argument_and_option_of_every_command_has_a_help_line():
    assert undescribed(build_parser()) == []
    toy = argparse.ArgumentParser()
    toy.add_subparsers().add_parser("caption").add_argument("--device")
    assert undescribed(toy) == ["captioner caption --device"]      # the walk finds one without


def test_bare_captioner_prints_its_commands_and_exits_2(capsys):
    for line in ([], ["--debug"]):
        with pytest.raises(SystemExit) as stopped:
            main(line)
        assert stopped.value.code == 2     # argparse's status for a missing argument
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("usage: captioner")
        assert all(f"    {command} " in err for command in ("evaluate", "caption", "attend", "export", "serve", "demo"))


@pytest.mark.parametrize("command", CHECKPOINT_COMMANDS)
def test_the_checkpoint_is_the_option_of_every_command_and_both_forms_at_once_are_refused(command, capsys):
    rest, several = CHECKPOINT_COMMANDS[command]
    args = parse_args([command, *rest, "--checkpoint", "a.pt", "decode.beam=2"])
    assert args.checkpoint == (["a.pt"] if several else "a.pt") and args.overrides == ["decode.beam=2"]
    if several:
        two = parse_args([command, *rest, "--checkpoint", "a.pt", "--checkpoint", "b.pt"])
        assert two.checkpoint == ["a.pt", "b.pt"]
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit) as refused:
        parse_args([command, *rest])
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"captioner {command}: error: give the checkpoint as --checkpoint PATH")
    if command in ("caption", "attend"):       # no old form: the checkpoint among the images is named
        with pytest.raises(SystemExit):
            parse_args([command, "a.pt", *rest])
        assert "(a.pt looks like a checkpoint, not an image)" in capsys.readouterr().err
        return
    with pytest.raises(SystemExit) as refused:
        parse_args([command, "a.pt", *rest, "--checkpoint", "b.pt"])
    assert refused.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == (
        f"captioner {command}: error: give the checkpoint once, as --checkpoint PATH, not also as a positional "
        "argument")


@pytest.mark.parametrize("command", ["evaluate", "ground", "export", "serve"])
def test_the_old_positional_checkpoint_is_taken_for_now_with_a_notice(command, capsys):
    rest, several = CHECKPOINT_COMMANDS[command]
    old = parse_args([command, "decode.beam=2", "a.pt", *rest, "--device" if command != "export" else "--onnx",
                      *(["cpu"] if command != "export" else []), "decode.max_length=5"])
    assert old.checkpoint == (["a.pt"] if several else "a.pt")
    assert old.overrides == ["decode.beam=2", "decode.max_length=5"]          # still taken out wherever they stand
    assert capsys.readouterr().err == NOTICE + "\n"


def test_the_old_form_still_runs(served_checkpoints, tmp_path, capsys):
    assert main(["export", served_checkpoints["soft"], "--out", str(tmp_path / "old")]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == NOTICE and (tmp_path / "old" / "config.json").is_file()
    assert f"captioner caption IMAGE --checkpoint {tmp_path / 'old'}" in out


def test_caption_without_images_says_so_in_words(served_checkpoints, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["caption", "--checkpoint", served_checkpoints["soft"], "decode.beam=2"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.splitlines()[-1] == "captioner caption: error: give one or more image files"
    assert "required" not in err and "section.key=value," not in err


def test_attend_draws_one_figure_per_image(served_checkpoints, tiny_coco, tmp_path, capsys):
    checkpoint = served_checkpoints["soft"]
    first, second = sorted((tiny_coco / "images" / "test").glob("*.png"))[:2]
    namesake = tmp_path / "copy" / first.name          # another image of the same name
    namesake.parent.mkdir()
    namesake.write_bytes(second.read_bytes())
    broken = tmp_path / "broken.png"
    broken.write_text("not an image")
    figures = tmp_path / "figures"
    assert main(["attend", str(first), str(broken), str(second), str(namesake), "--checkpoint", checkpoint,
                 "--out", str(figures), "decode.max_length=4"]) == 1          # the unreadable one named, the rest drawn
    out, err = capsys.readouterr()
    assert sorted(path.name for path in figures.iterdir()) == sorted([first.name, second.name, f"{first.stem}-2.png"])
    assert f"wrote {figures / f'{first.stem}-2.png'}" in out
    assert len(err.splitlines()) == 1 and err.startswith(f"captioner: error: {broken}: ")
    # one image: --out is the figure (or, an existing folder, where it goes); several: never a PNG file
    assert main(["attend", str(first), "--checkpoint", checkpoint, "--out", str(tmp_path / "one.png")]) == 0
    assert main(["attend", str(first), "--checkpoint", checkpoint, "--out", str(tmp_path / "copy")]) == 0
    assert (tmp_path / "one.png").is_file() and (tmp_path / "copy" / f"{first.stem}.png").is_file()
    capsys.readouterr()
    assert main(["attend", str(first), str(second), "--checkpoint", checkpoint,
                 "--out", str(tmp_path / "two.png")]) == 1
    assert capsys.readouterr().err == (f"captioner: error: {tmp_path / 'two.png'}: 2 images need a folder for their "
                                       "figures (--out DIR), not a file\n")
    assert not (tmp_path / "two.png").exists()


def test_the_help_of_the_captioning_commands_describes_their_arguments(capsys):
    for command in ("caption", "serve"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert text.startswith(f"usage: captioner {command} [-h] --checkpoint PATH")
        assert "CKPT" not in text.split("\n\n")[0]          # the old form is not shown in the usage line
        words = " ".join(text.split())
        assert "--device DEVICE where to run: auto" in words
        described = "IMAGE the image files to caption" if command == "caption" else "--port PORT port to listen on"
        assert described in words
