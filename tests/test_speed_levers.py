"""Speed levers that must not change what is learned: the compiled per-word step and bfloat16 autocast on the
CPU agree with plain float32 training within stated tolerances, the allocator set-up is harmless, and with the
levers off nothing changes (every other test runs that way)."""

import copy
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from captioner.models.captioner import compile_decoder
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.models.transformer_decoder import TransformerDecoder, TransformerDecoderConfig
from captioner.objectives.losses import caption_loss
from captioner.training.engine import autocast

CAPTIONS = torch.tensor([[1, 5, 6, 7, 2, 0], [1, 8, 2, 0, 0, 0], [1, 5, 5, 9, 9, 2], [1, 4, 2, 0, 0, 0]])


def lstm(attention_mode: str = "soft") -> LSTMDecoder:
    """A tiny LSTM decoder; marginal attention over the top 4 regions and the others' soft context."""
    torch.manual_seed(0)
    marginal = {"marginal_regions": 4, "marginal_rest": "soft"} if attention_mode == "marginal" else {}
    return LSTMDecoder(LSTMDecoderConfig(vocab_size=12, region_dim=16, grid=(3, 4), attention_dim=12, embed_dim=10,
                                         hidden_dim=14, dropout=0.0, attention_mode=attention_mode, **marginal))


def transformer() -> TransformerDecoder:
    torch.manual_seed(0)
    return TransformerDecoder(TransformerDecoderConfig(vocab_size=12, region_dim=16, grid=(3, 4), d_model=16,
                                                       num_layers=1, num_heads=2, ffn_dim=32, dropout=0.0))


def update_difference(start, a, b) -> float:
    """How far two trainings from ``start`` ended apart, relative to how far they went: ||(b - start) - (a - start)||
    / ||a - start|| over all weights. Adam turns the rounding noise of gradients that should be zero (the scores'
    shared bias, which softmax ignores) into full-size steps, so weights are compared as a whole."""
    def flat(model):
        return torch.cat([p.detach().flatten() for p in model.parameters()])
    moved = flat(a) - flat(start)
    return ((flat(b) - flat(start)) - moved).norm().item() / moved.norm().item()


def train_steps(decoder, steps: int, amp: bool = False) -> list[float]:
    features = torch.randn(4, 12, 16, generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        with autocast(torch.device("cpu"), amp):
            out = decoder(features, CAPTIONS)
            loss = caption_loss(out.logits, CAPTIONS[:, 1:], out.alpha, 1.0)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("make", [lstm, transformer], ids=["lstm", "transformer"])
def test_compiled_training_matches_eager(make):
    start, eager = make(), make()
    compiled = copy.deepcopy(eager)
    assert compile_decoder(compiled)
    a, b = train_steps(eager, 3), train_steps(compiled, 3)
    assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
    assert update_difference(start, eager, compiled) < 0.05                         # measured: 0.016 at most


@pytest.mark.parametrize("mode", ["soft", "hard", "marginal"])
def test_torch_compile_tracing_the_whole_lstm_pass_gets_the_eager_gradients(mode):
    """What compiling a whole model does to the decoder, dynamo and AOT autograd tracing its teacher-forced pass
    (``aot_eager`` leaves out code generation): the one-product weight gradients read a record that the steps fill
    after their node's forward, which a tracer cannot follow, so traced code takes per-step autograd (on a GPU,
    compiling the whole model once failed here with an empty ``torch.cat``). Errors must surface, not fall back."""
    features = torch.randn(4, 12, 16, generator=torch.Generator().manual_seed(1))

    def gradients(forward, decoder):
        torch.manual_seed(3)                                   # the same location samples for hard attention
        out = forward(features, CAPTIONS)
        caption_loss(out.logits, CAPTIONS[:, 1:], out.alpha, 1.0)["loss"].backward()
        return {name: p.grad for name, p in decoder.named_parameters()}

    eager = lstm(mode)
    traced = copy.deepcopy(eager)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(suppress_errors=False):
        expected, got = gradients(eager, eager), gradients(torch.compile(traced, backend="aot_eager"), traced)
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_bf16_autocast_training_stays_close_to_fp32():
    start, fp32, bf16 = lstm(), lstm(), lstm()
    a, b = train_steps(fp32, 5), train_steps(bf16, 5, amp=True)
    assert a == pytest.approx(b, rel=1e-3)                                          # losses within 0.1 %
    assert update_difference(start, fp32, bf16) < 0.1                               # measured: 0.03


FAULTS = """
import ctypes, resource, sys
from captioner.core.memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
size = 64 * 2**20                                     # a beam search step's largest tensor, at the paper's sizes
block = libc.malloc(size); ctypes.memset(block, 1, size); libc.free(block)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = libc.malloc(size); ctypes.memset(block, 1, size)          # page faults only if the memory went back
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"), reason="glibc only")
def test_keeping_freed_memory_spares_the_page_faults_of_a_step_tensor_taken_again():
    def run(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True).stdout
        kept, faults = out.split()
        return kept, int(faults)

    (kept, with_it), (_, without) = run("keep"), run("default")
    assert kept == "True"
    assert without > 8000 and with_it < 100        # 16,384 pages of 4 kB faulted in again by default; none here


DENORMALS = """
import sys, torch
from captioner.cli import main
torch.set_num_threads(2)
if sys.argv[1] == "late":
    torch.randn(1 << 22).sum()                  # torch's worker threads exist before the flag is set
if sys.argv[1] == "setup":
    from captioner.core.process import set_up_process
    assert all(set_up_process().values())        # what a script that trains in its own process calls first
elif sys.argv[1] != "off":
    main(["config", "--reference"])             # any command sets it first
tiny = torch.full((1 << 22,), 1e-30) * 1e-9     # 1e-39: denormal in float32, computed on both threads
print((tiny == 0).float().mean().item())
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86's flush-to-zero flag")
def test_a_command_flushes_denormals_to_zero_in_every_torch_thread():
    def zero_share(mode: str) -> float:
        done = subprocess.run([sys.executable, "-c", DENORMALS, mode], capture_output=True, text=True, check=True)
        return float(done.stdout.split()[-1])

    assert zero_share("command") == 1.0
    assert zero_share("setup") == 1.0
    assert zero_share("off") == 0.0
    assert 0 < zero_share("late") < 1           # set after the thread pool exists: the calling thread's share only


def test_scripts_that_train_or_score_in_their_own_process_set_it_up_as_a_command_does():
    scripts = Path(__file__).resolve().parent.parent / "scripts"
    computes = re.compile(r"^\s*from captioner\.(training\.engine|workflows\.evaluate) import", re.MULTILINE)
    computing = [path for path in scripts.glob("*.py") if computes.search(path.read_text())]
    assert len(computing) >= 5
    for path in computing:
        assert 'if __name__ == "__main__":\n    set_up_process()' in path.read_text(), path.name


@pytest.mark.parametrize("make", [lstm, transformer], ids=["lstm", "transformer"])
def test_a_compiled_decoding_step_gives_the_same_captions(make):
    from captioner.decoding.search import TokenRules, beam_search

    eager = make().eval()
    compiled = copy.deepcopy(eager)
    assert compile_decoder(compiled, targets=("step",))
    features = torch.randn(3, 12, 16, generator=torch.Generator().manual_seed(2))
    for a, b in zip(*(beam_search(d, features, beam=3, max_length=6, rules=TokenRules(1, 2)) for d in (eager, compiled))):
        assert a.tokens == b.tokens and a.log_prob == pytest.approx(b.log_prob, abs=1e-4)
