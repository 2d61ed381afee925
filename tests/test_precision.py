"""train.amp=auto: float32 on a CPU without native bf16 (unmeasured), bf16 only where a probe finds it faster."""

import logging

import pytest
import torch
from conftest import tiny_config
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from captioner.checkpoint import build_model, load_checkpoint
from captioner.config import load_config
from captioner.objectives.losses import build_loss
from captioner.training import precision
from captioner.training.engine import train

ZEN3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n\nprocessor\t: 1\n"
ZEN4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw avx512_bf16 vnni\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.fixture
def model_and_loss():
    config = load_config(None, ["encoder.pretrained=false", "encoder.image_size=32", "encoder.stride=16",
                                "model.lstm.hidden_dim=16", "model.lstm.attention_dim=8", "model.lstm.embed_dim=8"])
    model = build_model(config, vocab_size=20, pretrained=False)
    return model, build_loss(model.decoder, config.loss)


def fake_cpu(monkeypatch, tmp_path, text):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    monkeypatch.setattr(precision, "CPUINFO", cpuinfo)


def fake_probe(monkeypatch, ratio):
    calls = []

    def probe(*args):
        calls.append(args)
        return ratio
    monkeypatch.setattr(precision, "bf16_step_ratio", probe)
    return calls


@pytest.mark.parametrize("text, native, flag", [(ZEN3, False, "avx512_bf16 or amx_bf16"), (ZEN4, True, "avx512_bf16"),
                                                (GRAVITON3, True, "bf16"), ("processor\t: 0\n", None, "no CPU flags")])
def test_native_bf16_is_read_from_the_cpu_flags(monkeypatch, tmp_path, text, native, flag):
    fake_cpu(monkeypatch, tmp_path, text)
    found, evidence = precision.native_bf16_cpu()
    assert found is native and flag in evidence


def test_auto_on_a_cpu_without_native_bf16_is_float32_without_measuring(monkeypatch, tmp_path, model_and_loss):
    fake_cpu(monkeypatch, tmp_path, ZEN3)
    calls = fake_probe(monkeypatch, 0.1)          # even a probe that would say bf16 is never asked
    choice = precision.choose_precision("auto", *model_and_loss, 20, 64, torch.device("cpu"))
    assert not choice.amp and not calls and "no native bf16" in choice.reason
    assert choice.describe(torch.device("cpu")).startswith("float32 (train.amp=auto: the CPU has no native bf16")


@pytest.mark.parametrize("ratio, amp", [(0.5, True), (0.79, True), (0.85, False), (3.0, False)])
def test_auto_on_a_native_bf16_cpu_takes_bf16_only_where_the_probe_finds_it_faster(monkeypatch, tmp_path,
                                                                                  model_and_loss, ratio, amp):
    fake_cpu(monkeypatch, tmp_path, ZEN4)
    calls = fake_probe(monkeypatch, ratio)
    choice = precision.choose_precision("auto", *model_and_loss, 20, 64, torch.device("cpu"))
    assert choice.amp is amp and len(calls) == 1 and f"{ratio:.2f}x the float32 time" in choice.reason
    assert choice.describe(torch.device("cpu")).startswith("bf16 autocast" if amp else "float32")


def test_amp_true_where_bf16_is_slower_obeys_and_warns_with_the_ratio(monkeypatch, tmp_path, model_and_loss, caplog):
    fake_cpu(monkeypatch, tmp_path, ZEN3)
    fake_probe(monkeypatch, 20.0)
    with caplog.at_level(logging.WARNING, logger="captioner.training.precision"):
        choice = precision.choose_precision(True, *model_and_loss, 20, 64, torch.device("cpu"))
    assert choice.amp
    assert "20.00x the float32 time" in caplog.text and "train.amp=auto (or false)" in caplog.text
    caplog.clear()
    fake_probe(monkeypatch, 0.5)
    with caplog.at_level(logging.WARNING, logger="captioner.training.precision"):
        assert precision.choose_precision(True, *model_and_loss, 20, 64, torch.device("cpu")).amp
    assert not caplog.text


def test_false_and_cuda_are_decided_without_measuring(monkeypatch, model_and_loss):
    calls = fake_probe(monkeypatch, 0.1)
    assert not precision.choose_precision(False, *model_and_loss, 20, 64, torch.device("cpu")).amp
    assert precision.choose_precision("auto", *model_and_loss, 20, 64, torch.device("cuda")).amp
    assert not calls


def test_a_precision_is_named_by_what_autocast_computes_in_on_its_device(monkeypatch):
    assert precision.precision_name(False, torch.device("cpu")) == "float32"
    assert precision.precision_name(True, torch.device("cpu")) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)     # a V100, a T4
    assert precision.precision_name(True, torch.device("cuda")) == "fp16"
    assert precision.precision_name(False, torch.device("cuda")) == "float32"


def test_the_probe_leaves_weights_loss_state_and_random_streams_as_they_were(model_and_loss):
    model, loss = model_and_loss
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    random_before = torch.get_rng_state()
    ratio = precision.bf16_step_ratio(model, loss, 20, 64, torch.device("cpu"))
    assert 0 < ratio < float("inf")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), random_before) and not model.training


def test_a_run_states_its_decision_and_a_resumed_run_keeps_it(monkeypatch, tmp_path, tiny_coco, caplog):
    fake_cpu(monkeypatch, tmp_path, ZEN4)
    fake_probe(monkeypatch, 0.5)
    config = tiny_config(tiny_coco, tmp_path / "run", train={"amp": "auto", "epochs": 1})
    with caplog.at_level(logging.INFO, logger="captioner.training.engine"):
        train(config)
    assert "precision: bf16 autocast (train.amp=auto: a bf16 training step took 0.50x" in caplog.text
    progress = load_checkpoint(tmp_path / "run" / "last.pt")["progress"]
    assert progress["amp"] is True and progress["precision"] == "bf16"     # what the results tables print
    calls = fake_probe(monkeypatch, 3.0)          # the machine's answer changed: the run keeps its precision
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="captioner.training.engine"):
        train(tiny_config(tiny_coco, tmp_path / "run", train={"amp": "auto", "epochs": 2}), resume=True)
    assert not calls and "precision: bf16 autocast (as decided when the run started)" in caplog.text


def test_a_slow_probe_still_measures_its_minimum_of_pairs_and_takes_their_median(monkeypatch, model_and_loss):
    """However slow a step is, the probe times PROBE_MIN_PAIRS interleaved pairs, and one pair slowed down by
    another process (here: a float32 step taking 100x its time) does not decide."""
    model, loss = model_and_loss
    monkeypatch.setattr(precision, "PROBE_SECONDS", 0.0)
    steps = []
    clock = iter(range(10**6))
    monkeypatch.setattr(precision.time, "perf_counter", lambda: float(next(clock)))

    def timed_forward(regions, captions, forward=model.decoder.forward):
        steps.append(torch.is_autocast_enabled("cpu"))
        if len(steps) == 3:         # the first measured step (float32): 100 ticks instead of 1
            for _ in range(99):
                next(clock)
        return forward(regions, captions)
    monkeypatch.setattr(model.decoder, "forward", timed_forward)
    ratio = precision.bf16_step_ratio(model, loss, 20, 64, torch.device("cpu"))
    assert len(steps) == 2 + 2 * precision.PROBE_MIN_PAIRS       # warm-up pair, then the minimum
    assert steps[2:] == [False, True, True, False] * (precision.PROBE_MIN_PAIRS // 2)
    assert ratio == 1.0


class Float32Made(TorchDispatchMode):
    """Records each operation that makes a float32 tensor from a float64 one, or from no tensor at all."""

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        made = any(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in tree_leaves(out))
        if made and (not inputs or any(t.dtype == torch.float64 for t in inputs)):
            self.found.append(str(func))
        return out


@pytest.mark.parametrize("overrides", [
    ["model.lstm.attention_mode=soft"], ["model.lstm.attention_mode=hard"], ["model.lstm.attention_mode=marginal"],
    ["model.lstm.attention_mode=variational", "model.lstm.region_position=sinusoidal"],
    ["model.decoder=transformer", "model.transformer.region_position=sinusoidal"]])
def test_a_float64_model_keeps_float64_through_its_loss_and_decoding(overrides):
    """The result probes run in float64 (captioner.results.fingerprint): no step of a decoder, its loss or the beam
    search (diverse groups, logit adjustment) makes a float32 tensor on the way, which would bring back the rounding
    the probes run in float64 to avoid."""
    from captioner.core.floats import widened
    from captioner.decoding.search import DecodeConfig, decode
    from captioner.results import fingerprint

    assert widened(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    with fingerprint.probe_conditions():
        config = load_config(None, ["data.features=features", "model.lstm.hidden_dim=16", "model.lstm.attention_dim=8",
                                    "model.lstm.embed_dim=8", "model.transformer.d_model=16",
                                    "model.transformer.ffn_dim=16", "model.transformer.num_heads=2", *overrides])
        vocab = fingerprint.probe_vocabulary()
        vocab = type(vocab)(vocab.words, counts=[2] * len(vocab))
        with Float32Made() as made:
            model = fingerprint.probe_model(config, vocab)
            batch = fingerprint.probe_batch(config, vocab, model)
            out = model(batch["captions"], features=batch["features"])
            losses = build_loss(model.decoder, config.loss)(out, batch["captions"][:, 1:])
            model.eval()
            regions = model.regions(features=batch["features"][:2])
            generated = decode(model.decoder, regions, vocab,
                               DecodeConfig(beam=4, beam_groups=2, max_length=5, logit_adjustment=0.5), images=[0, 1])
            if config.model.decoder == "transformer":           # its uncached step too, which decode never takes
                start = torch.full((2,), vocab.start_index)
                assert model.decoder.step(start, model.decoder.init_state(regions, use_cache=False))[0].dtype == (
                    torch.float64)
        floats = {name: value.dtype for name, value in losses.items() if value.is_floating_point()}
        assert "loss" in floats and floats == dict.fromkeys(floats, torch.float64)
        assert all(g.attention["alpha"].dtype == torch.float64 for g in generated)
        assert made.found == []
