"""train.ema_decay: the moving average of the weights follows its definition, is what validates and what the
checkpoints hold as their model, and a resumed run (across the switch to SCST too) equals an uninterrupted one."""

import pytest
import torch
from torch import nn

from captioner.checkpoint import load_checkpoint
from captioner.config import load_config
from captioner.errors import CaptionerError
from captioner.training import engine
from captioner.training.averaging import WeightAverage
from captioner.training.engine import train
from tests.conftest import tiny_config


def test_the_average_follows_its_definition_and_leaves_frozen_and_shared_weights_alone():
    torch.manual_seed(0)
    model = nn.ModuleDict({"a": nn.Linear(3, 2), "frozen": nn.Linear(2, 2)})
    model["frozen"].requires_grad_(False)
    model["tied"] = model["a"]                              # one parameter under two names: averaged once
    average = WeightAverage(model, decay=0.9)
    assert len(average.params) == 2
    expected = [p.detach().clone().double() for p in average.params]
    for n in range(1, 30):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        average.update()
        d = min(0.9, (1 + n) / (10 + n))                    # short over the first updates, then the decay
        expected = [d * e + (1 - d) * p.detach().double() for e, p in zip(expected, average.params)]
    for got, want in zip(average.average, expected):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with average.applied():
        assert torch.equal(model["a"].weight, average.average[0]) and torch.equal(model["tied"].bias, average.average[1])
        assert torch.equal(model["frozen"].weight, weights["frozen.weight"])
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())     # its own weights back


def test_the_decay_must_be_below_one():
    with pytest.raises(CaptionerError, match="ema_decay"):
        load_config(None, ["train.ema_decay=1.0"])


def test_validation_and_checkpoints_see_the_average_and_training_steps_the_weights(tiny_coco, tmp_path, monkeypatch):
    validated = []

    def validate(model, *args, **kwargs):
        validated.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"CIDEr": float(len(validated))}             # a gain every epoch: best.pt is the last epoch

    monkeypatch.setattr(engine, "validate", validate)
    train(tiny_config(tiny_coco, tmp_path / "run", train={"ema_decay": 0.5, "lr": 0.01}))
    last, best = (load_checkpoint(tmp_path / "run" / f"{name}.pt") for name in ("last", "best"))
    for checkpoint in (last, best):
        assert all(torch.equal(checkpoint["model"][k], validated[-1][k]) for k in validated[-1])
    trained = last["trained"]["weights"]
    assert last["trained"]["average_updates"] == last["progress"]["step"] == 10
    assert trained and all(k.startswith("decoder.") for k in trained)        # the frozen encoder is not averaged
    assert any(not torch.equal(trained[k], last["model"][k]) for k in trained)
    plain = tiny_config(tiny_coco, tmp_path / "plain", train={"lr": 0.01})
    monkeypatch.setattr(engine, "validate", lambda *args, **kwargs: {"CIDEr": 0.0})
    train(plain)
    assert "trained" not in load_checkpoint(tmp_path / "plain" / "last.pt")   # off: checkpoints as before


@pytest.mark.parametrize("objective", [
    {},
    {"objective": "scst", "scst_after_epoch": 1, "scst_samples": 2, "scst_batch_size": 4, "scst_lr": 0.001},
], ids=["cross-entropy", "across the switch to SCST"])
def test_resume_with_an_average_equals_uninterrupted(tiny_coco, tmp_path, objective):
    settings = {"ema_decay": 0.7, "lr": 0.01, "epochs": 3, **objective}
    train(tiny_config(tiny_coco, tmp_path / "full", train=settings))
    train(tiny_config(tiny_coco, tmp_path / "split", train={**settings, "epochs": 1}))
    train(tiny_config(tiny_coco, tmp_path / "split", train=settings), resume=True)
    full, split = (load_checkpoint(tmp_path / name / "last.pt") for name in ("full", "split"))
    for key in ("model",):
        assert all(torch.equal(full[key][k], split[key][k]) for k in full[key])
    assert all(torch.equal(full["trained"]["weights"][k], split["trained"]["weights"][k]) for k in full["trained"]["weights"])
    assert full["trained"]["average_updates"] == split["trained"]["average_updates"]
    if objective:       # the average starts again at the switch, from the best cross-entropy weights
        assert full["trained"]["average_updates"] == full["progress"]["step"] - 5


@pytest.mark.parametrize("first, then", [(0.0, 0.9), (0.9, 0.0)], ids=["switched on", "switched off"])
def test_the_average_switched_at_a_resume_leaves_the_trained_weights_as_uninterrupted(tiny_coco, tmp_path, monkeypatch,
                                                                                    first, then):
    monkeypatch.setattr(engine, "validate", lambda *args, **kwargs: {"CIDEr": 0.0})

    def trained_weights(checkpoint):        # the weights the optimizer steps, wherever the checkpoint keeps them
        return checkpoint["trained"]["weights"] if "trained" in checkpoint else checkpoint["model"]

    train(tiny_config(tiny_coco, tmp_path / "full", train={"lr": 0.01, "epochs": 2, "ema_decay": then}))
    train(tiny_config(tiny_coco, tmp_path / "split", train={"lr": 0.01, "epochs": 1, "ema_decay": first}))
    train(tiny_config(tiny_coco, tmp_path / "split", train={"lr": 0.01, "epochs": 2, "ema_decay": then}), resume=True)
    full, split = (load_checkpoint(tmp_path / name / "last.pt") for name in ("full", "split"))
    want, got = trained_weights(full), trained_weights(split)
    assert all(torch.equal(got[k], want[k]) for k in want)     # the average never steers the training
    if then:                                                    # it starts at the resume, from the weights then
        assert split["trained"]["average_updates"] == 5 < full["trained"]["average_updates"]
    else:
        assert "trained" not in split
