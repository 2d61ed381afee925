"""The fused kernels of captioner.kernels against their plain PyTorch versions: the same values and gradients,
kernel by kernel and through a whole decoder's training step; and the switch between them."""

from pathlib import Path

import pytest
import torch

from captioner import kernels
from captioner.config import LossConfig
from captioner.kernels import additive_score, recurrence, word_loss
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.objectives.losses import HardAttentionLoss, caption_loss

START, END = 1, 2
CAPTIONS = torch.tensor([[START, 5, 6, 7, END, 0, 0], [START, 8, END, 0, 0, 0, 0], [START, 5, 5, 5, 5, 5, END],
                         [START, 9, 4, END, 0, 0, 0]])
FUSED_NODES = {"PrefixesBackward", "RecurrentTermsBackward", "AdditiveTanhScoreBackward",
               "WordNegativeLogLikelihoodBackward"}


@pytest.fixture(autouse=True)
def one_thread():
    """Tensors of a few dozen numbers: a second thread would only wait for the first (long, on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def worst(first: dict, second: dict) -> float:
    """The largest relative difference between same-named tensors: the norm of the difference over the larger norm
    (0 where both are zero)."""
    assert first.keys() == second.keys()
    return max(float((first[k] - second[k]).norm() / max(first[k].norm(), second[k].norm(), 1e-30)) for k in first)


def value_and_gradients(function, inputs: dict, upstream, keep_graph: bool = False) -> dict:
    """``function(**inputs)`` (a tensor or a tuple) and its gradients w.r.t. every floating input, against
    ``upstream`` (one tensor per output); with ``keep_graph``, a second backward pass must give the same."""
    leaves = {k: v.clone().requires_grad_() if torch.is_tensor(v) and v.is_floating_point() else v
              for k, v in inputs.items()}
    outputs = function(**leaves)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    upstream = upstream if isinstance(upstream, tuple) else (upstream,)
    tracked = [(o, u) for o, u in zip(outputs, upstream) if o.requires_grad]   # a constant output has no graph
    names = [k for k, v in leaves.items() if torch.is_tensor(v) and v.requires_grad]

    def gradients(**options):
        return torch.autograd.grad([o for o, _ in tracked], [leaves[k] for k in names], [u for _, u in tracked],
                                   **options)

    grads = gradients(retain_graph=keep_graph)
    if keep_graph:    # nothing saved was overwritten in place (the last pass may round in another order)
        again = gradients()
        torch.testing.assert_close(again, grads, rtol=1e-6, atol=1e-7)
    result = {f"out{i}": o.detach() for i, o in enumerate(outputs)}
    result.update({f"d_{k}": g for k, g in zip(names, grads)})
    assert all(g.abs().max() > 0 for g in grads), "a zero gradient proves nothing"
    return result


def tolerance(dtype) -> float:
    return 1e-12 if dtype == torch.float64 else 2e-6


def test_the_switch_defaults_to_fused_nests_and_is_restored_after_an_error():
    assert kernels.fused_enabled()
    with kernels.fused(False):
        assert not kernels.fused_enabled()
        with kernels.fused(True):
            assert kernels.fused_enabled()
        assert not kernels.fused_enabled()
    with pytest.raises(RuntimeError), kernels.fused(False):
        raise RuntimeError
    assert kernels.fused_enabled()


def score_inputs(dtype, bias: bool) -> dict:
    """Keys (B, L, A) = (3, 5, 4), queries (B, k, A) = (3, 2, 4), the score's weight (1, A) and bias (1,) or None."""
    torch.manual_seed(0)
    keys, query, weight, bias_ = (torch.randn(*shape, dtype=dtype) for shape in ((3, 5, 4), (3, 2, 4), (1, 4), (1,)))
    return {"keys": keys, "query": query, "weight": weight, "bias": bias_ if bias else None}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("keep_graph", [False, True])
def test_the_additive_score_fused_and_plain_agree_in_values_and_every_gradient(dtype, bias, keep_graph):
    inputs, upstream = score_inputs(dtype, bias), torch.randn(3, 2, 5, dtype=dtype)
    fused = value_and_gradients(additive_score.additive_tanh_scores_fused, inputs, upstream, keep_graph)
    plain = value_and_gradients(additive_score.additive_tanh_scores_plain, inputs, upstream)
    assert len(fused) == (5 if bias else 4) and worst(fused, plain) < tolerance(dtype)
    with torch.no_grad():    # decoding takes the fused forward without a node
        torch.testing.assert_close(additive_score.additive_tanh_scores_fused(**inputs), plain["out0"],
                                   rtol=tolerance(dtype), atol=tolerance(dtype))


def test_the_additive_score_dispatch_follows_the_switch():
    inputs = score_inputs(torch.float32, True)
    fused = additive_score.additive_tanh_scores_fused(**inputs)
    plain = additive_score.additive_tanh_scores_plain(**inputs)
    assert not torch.equal(fused, plain)        # tanh by a sigmoid: the two differ in their last bits
    assert torch.equal(additive_score.additive_tanh_scores(**inputs), fused)
    with kernels.fused(False):
        assert torch.equal(additive_score.additive_tanh_scores(**inputs), plain)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("uniform", [False, True])
@pytest.mark.parametrize("keep_graph", [False, True])
def test_the_word_loss_fused_and_plain_agree_in_values_and_gradients(dtype, uniform, keep_graph):
    torch.manual_seed(0)
    inputs = {"logits": torch.randn(9, 11, dtype=dtype), "targets": torch.randint(0, 11, (9,)), "uniform": uniform}
    upstream = (torch.tensor(0.7), torch.tensor(0.3 if uniform else 0.0))   # the fused node's contract: no
    # gradient of a spread it was not asked for (it would add p * g to the logits' gradient)
    fused = value_and_gradients(word_loss.word_negative_log_likelihood_fused, inputs, upstream, keep_graph)
    plain = value_and_gradients(word_loss.word_negative_log_likelihood_plain, inputs, upstream)
    assert fused["d_logits"].dtype == dtype and fused["out0"].dtype == dtype     # half precision alone is widened
    assert worst(fused, plain) < 2e-6
    assert (fused["out1"] != 0) == uniform
    with kernels.fused(False):
        assert torch.equal(word_loss.word_negative_log_likelihood(**inputs)[0], plain["out0"])


@pytest.mark.parametrize("fused", [False, True])
def test_the_word_loss_of_half_precision_logits_is_float32(fused):
    logits, targets = torch.randn(9, 11).bfloat16(), torch.randint(0, 11, (9,))
    with kernels.fused(fused):
        nll, spread = word_loss.word_negative_log_likelihood(logits, targets, uniform=True)
    assert nll.dtype == spread.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_node_for_the_prefixes_has_the_gradients_of_slices(dtype):
    sizes = [4, 4, 3, 1]
    tensor, upstream = torch.randn(4, 3, 2, dtype=dtype), tuple(torch.randn(n, 3, 2, dtype=dtype) for n in sizes)
    fused = value_and_gradients(lambda tensor: tuple(recurrence.prefixes(tensor, sizes)), {"tensor": tensor}, upstream)
    with kernels.fused(False):
        plain = value_and_gradients(lambda tensor: tuple(recurrence.prefixes(tensor, sizes)), {"tensor": tensor},
                                    upstream)
    assert worst(fused, plain) < tolerance(dtype)
    assert recurrence.prefixes(None, sizes) == [None] * 4


def make_decoder(attention: str, gate: str, mode: str, **options) -> LSTMDecoder:
    torch.manual_seed(0)
    return LSTMDecoder(LSTMDecoderConfig(vocab_size=13, region_dim=6, grid=(2, 3), attention=attention, gate=gate,
                                         attention_mode=mode, attention_dim=5, embed_dim=7, hidden_dim=8,
                                         dropout=0.0, **options))


def training_step(decoder: LSTMDecoder, features: torch.Tensor, loss_config: LossConfig) -> tuple[dict, set]:
    """One teacher-forced step from the seed 1: every loss term and every weight's gradient (but those zero for any
    input, to rounding), and the names of the graph's nodes."""
    torch.manual_seed(1)
    decoder.zero_grad()
    out = decoder(features, CAPTIONS)
    targets = CAPTIONS[:, 1:]
    if decoder.samples_locations:
        terms = HardAttentionLoss(loss_config)(out, targets)
    else:
        terms = caption_loss(out.logits, targets, out.alpha, loss_config.doubly_stochastic,
                             label_smoothing=loss_config.label_smoothing)
    seen, stack = set(), [terms["loss"].grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    nodes = {type(node).__name__ for node in seen}
    terms["loss"].backward()
    result = {name: t.detach().float() for name, t in terms.items() if torch.is_tensor(t) and t.is_floating_point()}
    grads = {name: parameter.grad for name, parameter in decoder.named_parameters()}
    largest = max(g.abs().max() for g in grads.values())
    for name, grad in grads.items():
        # a bias added to every region's score alike (the additive score's, the dot score's keys'): alpha ignores it
        shifts_every_score = name == "attention.energy.bias" or name == "attention.region_proj.bias" and (
            decoder.config.attention == "dot")
        assert (grad.abs().max() < 1e-5 * largest) == shifts_every_score, f"{name}: {grad.abs().max()} vs {largest}"
        if not shifts_every_score:
            result[name] = grad.clone()
    return result, nodes


DECODERS = [(attention, gate, mode) for mode in ("soft", "hard") for gate in ("scalar", "vector", "none")
            for attention in ("additive", "dot", "general", "none") if not (mode == "hard" and attention == "none")]


@pytest.mark.parametrize("attention, gate, mode", DECODERS)
def test_a_decoder_trains_a_step_to_the_same_loss_and_gradients_fused_and_plain(attention, gate, mode):
    """The recurrence (prefixes, one-product weight gradients), the additive score and the word loss together:
    within 1e-5 of each tensor's scale (in float64 too: the softmaxes and the loss are float32 in both); the fused
    graph holds the fused nodes, the plain one none."""
    loss_config = LossConfig(doubly_stochastic=1.0, label_smoothing=0.1, entropy_weight=0.01)
    for dtype in (torch.float32, torch.float64):
        decoder = make_decoder(attention, gate, mode, learned_sharpness=attention != "none",
                               region_norm="layer").to(dtype)                      # regions with a gradient
        features = torch.randn(4, 6, 6, dtype=dtype, generator=torch.Generator().manual_seed(2))
        fused, fused_nodes = training_step(decoder, features, loss_config)
        with kernels.fused(False):
            plain, plain_nodes = training_step(decoder, features, loss_config)
        assert worst(fused, plain) < 1e-5, (dtype, worst(fused, plain))
        expected = FUSED_NODES - ({"AdditiveTanhScoreBackward"} if attention != "additive" else set())
        expected -= {"WordNegativeLogLikelihoodBackward"} if mode == "hard" else set()
        assert fused_nodes & FUSED_NODES == expected and not plain_nodes & FUSED_NODES


def test_the_decoder_decodes_the_same_fused_and_plain():
    decoder = make_decoder("additive", "scalar", "soft").eval()
    features = torch.randn(4, 6, 6)
    with torch.no_grad():
        fused = decoder(features, CAPTIONS)
        with kernels.fused(False):
            plain = decoder(features, CAPTIONS)
    torch.testing.assert_close(fused.logits, plain.logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused.alpha, plain.alpha, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sabotage", ["recurrent", "score", "loss", "prefixes"])
def test_the_comparison_fails_when_a_fused_kernel_is_wrong(sabotage, monkeypatch):
    """Each fused kernel made slightly wrong (one gradient 1 % off) in turn: the comparison above must see it."""
    def scaled(function, index):
        def backward(ctx, *grads):
            result = list(function(ctx, *grads))
            result[index] = result[index] * 1.01
            return tuple(result)
        return staticmethod(backward)

    kernel, index = {"recurrent": (recurrence.RecurrentTerms, 2), "score": (additive_score.AdditiveTanhScore, 1),
                     "loss": (word_loss.WordNegativeLogLikelihood, 0), "prefixes": (recurrence.Prefixes, 0)}[sabotage]
    monkeypatch.setattr(kernel, "backward", scaled(kernel.backward, index))
    decoder = make_decoder("additive", "scalar", "soft", region_norm="layer")
    features = torch.randn(4, 6, 6, generator=torch.Generator().manual_seed(2))
    fused, _ = training_step(decoder, features, LossConfig(doubly_stochastic=1.0))
    with kernels.fused(False):
        plain, _ = training_step(decoder, features, LossConfig(doubly_stochastic=1.0))
    assert worst(fused, plain) > 1e-3


def test_the_model_and_loss_files_hold_no_kernel():
    """The paper's maths and the speed work apart: no hand-written backward pass where the equations are."""
    root = Path(__file__).resolve().parent.parent / "captioner"
    for name in ("models/lstm_decoder.py", "models/attention.py", "objectives/losses.py"):
        assert "autograd.Function" not in (root / name).read_text(), name
