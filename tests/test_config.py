"""The typed config: every setting refuses an illegal value in one line when the config is loaded, before any
training step; settings that depend on one another are held together at load as well."""

import json

import pytest

from captioner.cli import main
from captioner.config import SECTIONS, Config, complete, load_config, save_config
from captioner.core.settings import kind_of, matches_kind, settings_of
from captioner.errors import CaptionerError
from captioner.models.captioner import DECODERS
from tests.conftest import tiny_config


def every_setting():
    """``(dotted name, section class, field name)`` of every setting, the decoders' included."""
    for name, kind in SECTIONS.items():
        for key in settings_of(kind):
            yield f"{name}.{key}", kind, key
    for name, entry in DECODERS.items():
        for key in settings_of(entry.config):
            yield f"model.{name}.{key}", entry.config, key


def illegal_values(cls, name: str) -> list:
    """Values that setting ``name`` of section ``cls`` refuses: one of the wrong type, and one past each bound or
    outside the choices."""
    field, kind = settings_of(cls)[name], kind_of(cls, name)
    meta = field.metadata
    wrong_type = {"not": "a setting value"}
    if matches_kind(wrong_type, kind):                     # a mapping setting: a list is of the wrong type
        wrong_type = ["not", "a mapping"]
    values = [wrong_type]
    if meta.get("choices"):
        values.append("not-one-of-the-choices")
    for bound, step in (("minimum", -1), ("above", 0), ("maximum", 1), ("below", 0)):
        if meta.get(bound) is not None:
            past = meta[bound] + step
            values.append(past if not matches_kind([past], kind) else [past])
    return values


def one_line_refusal(capsys, arguments: list[str]) -> str:
    """The one line ``captioner`` printed when it refused ``arguments`` (exit status 1, no traceback)."""
    assert main(arguments) == 1, arguments
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, (arguments, err)
    return lines[0]


def test_every_setting_refuses_an_illegal_value_in_one_line_before_any_training_step(tiny_coco, tmp_path, capsys):
    unbounded = []
    for dotted, kind, key in every_setting():
        values = illegal_values(kind, key)
        if len(values) == 1 and kind_of(kind, key) in (int, float, int | None, float | None):
            unbounded.append(dotted)
        for value in values:
            override = f"{dotted}={json.dumps(value)}"
            with pytest.raises(CaptionerError) as refused:
                load_config(None, [override])
            message = str(refused.value)
            assert message.startswith(f"override '{override}': {dotted} must be ") and "\n" not in message, message
    assert unbounded == ["model.transformer.attention_layer"]      # every other number has a bound (it counts back)
    # through the command line: one line, exit status 1, and not one training step (no run folder)
    config = tmp_path / "tiny.yaml"
    save_config(tiny_config(tiny_coco, tmp_path / "run"), config)
    for override in ("train.epochs=0", "model.lstm.dropout=1", "loss.hard_reward=sometimes", "data.strict=maybe",
                     "encoder.stride=8", "decode.top_p=0", "run.seed=-1", "model.decoder=gru",
                     "model.transformer.num_heads=0"):
        line = one_line_refusal(capsys, ["train", str(config), override])
        assert line.startswith(f"captioner: error: override '{override}': "), line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, message", [
    (["decode.beam=4", "decode.beam_groups=3"], r"decode.beam \(4\) must be a positive multiple of decode.beam_groups"),
    (["decode.beam=2", "decode.n_best=3"], r"decode.n_best \(3\) must be between 1 and decode.beam \(2\)"),
    (["decode.min_length=9", "decode.max_length=8"], r"decode.min_length \(9\) must not exceed decode.max_length"),
    (["model.decoder=transformer", "model.transformer.d_model=30", "model.transformer.num_heads=4"],
     r"model.transformer: d_model \(30\) must be a multiple of num_heads \(4\)"),
    (["model.decoder=transformer", "model.transformer.attention_layer=3"],
     "model.transformer: attention_layer must name one of the 3 layers, not 3"),
    (["model.lstm.attention=none", "model.lstm.attention_mode=hard"], "model.lstm: hard attention needs an attention score"),
    (["model.lstm.region_position=sinusoidal", "model.lstm.position_dim=6"], "model.lstm: position_dim must be a multiple of 4"),
    (["train.objective=scst", "train.scst_samples=1"], "train.scst_baseline mean needs train.scst_samples of at least 2"),
    (["encoder.name=mobilenet_v2", "encoder.image_size=64", "encoder.grid=[5, 5]"], r"encoder.grid \[5, 5\] is finer than"),
    (["encoder.name=vgg19", "encoder.image_size=8"], r"encoder.image_size \[8, 8\] is smaller than the stride 16"),
    (["data.format=karpathy", "data.karpathy=a.json"], "data.format karpathy needs both data.karpathy and data.image_root"),
    (["run.device=gpu"], r"run.device: unknown device 'gpu' \(use auto, cpu, cuda or cuda:N\)"),
])
def test_settings_that_depend_on_one_another_are_held_together_at_load(overrides, message):
    with pytest.raises(CaptionerError, match=message):
        load_config(None, overrides)


def test_a_config_round_trips_through_its_plain_form_and_old_checkpoints_complete():
    config = load_config(None, ["model.decoder=transformer", "model.transformer.d_model=64", "train.wandb_tags=[a]",
                                "data.captions={train: c.json}", "encoder.image_size=[64, 96]"])
    assert Config.from_dict(config.to_dict()) == config
    assert complete({"model": {"hidden_dim": 7}, "train": {"lr": 0.5, "retired_setting": 1}}).to_dict() == \
        load_config(None, ["model.lstm.hidden_dim=7", "train.lr=0.5"]).to_dict()      # moved, filled in, dropped


def test_a_config_that_extends_another_is_that_config_with_its_own_settings_over_it(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text("extends: configs/flickr8k_full_soft\ntrain:\n  epochs: 3\n  lr: 0.001\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base\ntrain:\n  lr: 0.002\n")               # a file beside it, without its .yaml
    assert load_config(child) == load_config("flickr8k_full_soft", ["train.epochs=3", "train.lr=0.002"])
    assert load_config(child, ["train.lr=0.003"]).train.lr == 0.003          # the command line wins over both
    mine = tmp_path / "flickr8k_full_soft.yaml"                              # one's own file named like the recipe
    mine.write_text("extends: flickr8k_full_soft.yaml\ntrain:\n  epochs: 2\n")
    assert load_config(mine) == load_config("flickr8k_full_soft", ["train.epochs=2"])
    (tmp_path / "base.yaml").write_text("extends: child\n")
    cycle = r"base.yaml: its 'extends' form a cycle \(.*child.yaml -> .*base.yaml -> .*child.yaml\)"
    with pytest.raises(CaptionerError, match=cycle):
        load_config(child)
    for base, message in [("no_such_recipe", "neither a file beside it nor a recipe"), ("null", "got None"),
                          ("[a, b]", "names one config file or recipe")]:
        child.write_text(f"extends: {base}\n")
        assert message in one_line_refusal(capsys, ["config", str(child)])
    (tmp_path / "base.yaml").write_text("extends: flickr8k_full_soft\ntrain:\n  epoks: 3\n")
    child.write_text("extends: base\n")
    with pytest.raises(CaptionerError, match=r"base.yaml: unknown setting 'train.epoks'"):
        load_config(child)                                                  # an error names the file it is in


def test_an_old_flat_setting_goes_to_the_decoder_a_base_config_names(tmp_path):
    (tmp_path / "base.yaml").write_text("extends: flickr8k_full_transformer\n")
    (tmp_path / "child.yaml").write_text("extends: base\nmodel:\n  dropout: 0.1\n")     # before decoders had sections
    config = load_config(tmp_path / "child.yaml")
    assert config.model.decoder == "transformer" and config.model.transformer.dropout == 0.1
    assert config.model.lstm.dropout == load_config("flickr8k_full_transformer").model.lstm.dropout


def test_a_packaged_recipe_that_extends_another_sets_only_what_differs_from_it():
    from captioner.config import _config_chain, _read_yaml, recipes

    extending = {name: path for name, path in recipes().items() if "extends" in _read_yaml(path)}
    assert {"flickr8k_full_marginal", "flickr8k_full_hard", "coco_hard"} <= set(extending)
    for name, path in extending.items():
        *bases, (own, _) = _config_chain(path)
        base_name = _read_yaml(path)["extends"]
        overrides = [f"{key}={json.dumps(value)}" for key, value in flat(own).items()]
        assert load_config(path) == load_config(base_name, overrides)
        stated = {key: value for base, _ in bases for key, value in flat(base).items()}
        repeated = [key for key, value in flat(own).items() if stated.get(key) == value]
        assert not repeated, f"{name} repeats {repeated} of {base_name}"


def flat(tree: dict, prefix: str = "") -> dict:
    """A config file's settings as ``{"section.key": value}``."""
    out = {}
    for key, value in tree.items():
        out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
    return out
