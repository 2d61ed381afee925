"""Marginal attention: one region per word summed out exactly, p(y_t) = sum_i alpha_ti p(y_t | a_i)."""

import pytest
import torch

from captioner.decoding.search import TokenRules, beam_search, greedy
from captioner.models import lstm_decoder
from captioner.objectives.losses import caption_loss
from tests.conftest import memorise, padded_logits
from tests.test_models import (
    captions_batch,
    make_decoder,
    parameter_gradients,
    stepwise_loss,
)

START, END = 1, 2
RULES = TokenRules(START, END)


def brute_force_log_likelihood(decoder, features, captions):
    """log p(y_t) of each real word (B, T), region by region in Python from the decoder's own layers: the soft
    recurrence gives h_t, alpha_t and beta_t; each region's eq. 7 distribution is weighted by alpha_t (over the
    ``marginal_regions`` regions of highest alpha, if set: renormalised, or with the other regions' soft context as
    one more component at the rest of alpha's mass)."""
    regions = decoder.prepare_regions(features)
    keys = decoder.attention.project_regions(regions)
    h, c = decoder.initial_hidden(regions)
    k = decoder.config.marginal_regions or regions.shape[1]
    out = torch.zeros(captions.shape[0], captions.shape[1] - 1)
    for t in range(captions.shape[1] - 1):
        embedded = decoder.embedding(captions[:, t])
        alpha = decoder.attention(keys, h, regions.shape[1])
        beta = torch.sigmoid(decoder.gate(h)) if decoder.gate is not None else torch.ones(h.shape[0], 1)
        z = beta * (alpha.unsqueeze(1) @ regions).squeeze(1)
        gates = decoder.input_gates(embedded) + decoder.recurrent_gates(torch.cat([z, h], dim=1))
        h, c = decoder.lstm_pointwise(gates, c)
        for b in range(captions.shape[0]):
            weights, index = alpha[b].topk(k)
            contexts = [regions[b, i] for i in index.tolist()]
            if decoder.config.marginal_rest == "soft" and k < regions.shape[1]:
                others = [i for i in range(regions.shape[1]) if i not in index.tolist()]
                rest = alpha[b, others].sum()
                contexts.append(sum(alpha[b, i] * regions[b, i] for i in others) / rest)
                weights = torch.cat([weights, rest[None]])
            else:
                weights = weights / weights.sum()
            deep = [torch.tanh(embedded[b] + decoder.out_hidden(h[b]) + decoder.out_context(beta[b] * context))
                    for context in contexts]
            p = sum(w * torch.softmax(decoder.out_words(d), -1) for w, d in zip(weights, deep))
            out[b, t] = p[captions[b, t + 1]].log()
    return out


@pytest.mark.parametrize("options", [{}, {"gate": "vector"}, {"gate": "none", "marginal_regions": 5},
                                     {"marginal_regions": 12},
                                     {"gate": "vector", "marginal_regions": 4, "marginal_rest": "soft"},
                                     {"marginal_regions": 11, "marginal_rest": "soft"}])
def test_the_marginal_likelihood_is_the_sum_over_regions_by_brute_force(options):
    decoder = make_decoder(attention_mode="marginal", region_norm="layer", **options).eval()
    features, captions = torch.randn(3, 12, 16), captions_batch()
    real = captions[:, 1:] != 0
    with torch.no_grad():
        out = decoder(features, captions)
        expected = brute_force_log_likelihood(decoder, features, captions)
    log_probs = padded_logits(out, real).log_softmax(-1).gather(2, captions[:, 1:, None]).squeeze(2)
    torch.testing.assert_close(log_probs[real], expected[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.logits.logsumexp(-1), torch.zeros(int(real.sum())), atol=1e-5, rtol=0)  # sums to 1
    # all the regions, or all but one with the rest's soft context, is the exact marginal; fewer is another model
    if options.get("marginal_regions") in (11, 12):
        decoder.config.marginal_regions = 0
        with torch.no_grad():
            torch.testing.assert_close(decoder(features, captions).logits, out.logits)


@pytest.mark.parametrize("options", [{"gate": "vector", "marginal_regions": 4, "marginal_rest": "soft"},
                                     {"marginal_regions": 11, "marginal_rest": "soft"}])
def test_the_soft_rests_gradients_are_the_brute_force_sums(options):
    """The soft rest is taken from the recurrence's soft context less its top-k part: every parameter's gradient
    equals the brute-force sum's, which forms the other regions' context region by region."""
    decoder = make_decoder(attention_mode="marginal", region_norm="layer", **options).eval()
    features, captions = torch.randn(3, 12, 16), captions_batch()
    real = captions[:, 1:] != 0
    out = decoder(features, captions)
    log_probs = padded_logits(out, real).log_softmax(-1).gather(2, captions[:, 1:, None]).squeeze(2)
    _, grads = parameter_gradients(decoder, log_probs[real].sum())
    _, expected = parameter_gradients(decoder, brute_force_log_likelihood(decoder, features, captions)[real].sum())
    for name, grad in grads.items():
        if name in expected:
            torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-5, msg=name)
        else:
            assert not grad.any(), name
    assert expected.keys() <= grads.keys()


def test_the_mixture_is_no_soft_attention_and_fewer_regions_change_it():
    features, captions = torch.randn(3, 12, 16), captions_batch()
    soft, marginal = make_decoder().eval(), make_decoder(attention_mode="marginal").eval()
    top = make_decoder(attention_mode="marginal", marginal_regions=2).eval()
    with torch.no_grad():
        a, b, c = (d(features, captions).logits.log_softmax(-1) for d in (soft, marginal, top))
        alpha = marginal(features, captions).alpha
    torch.testing.assert_close(alpha, soft(features, captions).alpha)          # the same recurrence: soft's context
    assert (a - b).abs().max() > 1e-3 and (b - c).abs().max() > 1e-3


@pytest.mark.parametrize("options", [{}, {"gate": "vector", "marginal_regions": 4},
                                     {"marginal_regions": 4, "marginal_rest": "soft"}])
def test_teacher_forcing_pieces_and_decode_steps_give_the_same_loss_and_gradients(options, monkeypatch):
    """The packed teacher forcing, in one piece or in pieces recomputed in the backward pass, against the
    decode-step interface word by word under plain autograd."""
    features, captions = torch.randn(3, 12, 16), captions_batch()
    decoder = make_decoder(attention_mode="marginal", **options)
    results = []
    for chunk in (lstm_decoder.MIXTURE_CHUNK, 3 * 30 * 12):          # one piece; pieces of 3 or 7 rows
        monkeypatch.setattr(lstm_decoder, "MIXTURE_CHUNK", chunk)
        out = decoder(features, captions)
        results.append(parameter_gradients(decoder, caption_loss(out.logits, captions[:, 1:], None, 0.0)["loss"]))
    results.append(parameter_gradients(decoder, stepwise_loss(decoder, features, captions)))
    (loss, grads), *others = results
    assert "out_context.weight" in grads and "attention.region_proj.weight" in grads
    for other_loss, other in others:
        torch.testing.assert_close(other_loss, loss, rtol=1e-6, atol=1e-6)
        assert other.keys() == grads.keys()
        for name in grads:
            torch.testing.assert_close(other[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("rest", ["renormalise", "soft"])
def test_only_the_soft_rest_asks_alpha_to_move_mass_onto_the_chosen_regions(rest):
    """d log p(y) / d delta, where delta raises the scores of the top-k regions together: zero when alpha is
    renormalised over them (the likelihood cannot see that mass), non-zero with the other regions' soft context."""
    decoder = make_decoder(attention_mode="marginal", marginal_regions=3, marginal_rest=rest, gate="none").eval()
    regions, scores = torch.randn(2, 12, 16), torch.randn(2, 12)
    top = torch.zeros(2, 12).scatter(1, scores.topk(3, dim=1).indices, 1.0)
    delta = torch.zeros((), requires_grad=True)
    alpha = torch.softmax(scores + delta * top, dim=1)
    base = decoder.embedding(torch.tensor([5, 6])) + decoder.out_hidden(torch.randn(2, 14))
    index = alpha.topk(3, dim=1).indices
    others_sum = (alpha.scatter(1, index, 0.0).unsqueeze(1) @ regions).squeeze(1)   # as context() sums the rest
    log_p = decoder._mixture(regions, base, torch.ones_like(base), torch.arange(2), alpha, None, index,
                             others_sum if rest == "soft" else None)
    (grad,) = torch.autograd.grad(log_p[:, 7].sum(), delta)
    assert grad.abs() > 1e-4 if rest == "soft" else grad.abs() < 1e-6


def test_dropout_keeps_one_mask_per_word_for_all_its_regions():
    decoder = make_decoder(attention_mode="marginal", dropout=0.5).train()
    seen = []
    original = decoder._mixture

    def mixture(regions, base, keep, *rest):
        seen.append(keep)
        return original(regions, base, keep, *rest)

    decoder._mixture = mixture
    with torch.no_grad():
        decoder(torch.randn(3, 12, 16), captions_batch())
    (keep,) = seen
    assert keep.shape == (12, 10) and set(keep.unique().tolist()) == {0.0, 2.0}


@pytest.mark.parametrize("options", [{"marginal_regions": 3}, {"marginal_regions": 3, "marginal_rest": "soft"},
                                     {"marginal_regions": 0}])
def test_a_beam_over_the_mixture_is_batched_as_one_at_a_time_and_beam_one_is_greedy(options):
    decoder = make_decoder(attention_mode="marginal", **options).eval()
    features = torch.randn(4, 12, 16)
    together = beam_search(decoder, features, beam=3, max_length=8, rules=RULES)
    for i, generation in enumerate(together):
        (alone,) = beam_search(decoder, features[i:i + 1], beam=3, max_length=8, rules=RULES)
        assert alone.tokens == generation.tokens and alone.log_prob == pytest.approx(generation.log_prob, abs=1e-5)
        torch.testing.assert_close(generation.attention["alpha"].sum(-1), torch.ones(len(generation.tokens)))
    one = beam_search(decoder, features, beam=1, max_length=8, rules=RULES)
    assert [g.tokens for g in greedy(decoder, features, max_length=8, rules=RULES)] == [b.tokens for b in one]


def test_marginal_attention_memorises_a_few_captions():
    decoder = make_decoder(attention_mode="marginal", dropout=0.0)
    torch.manual_seed(1)
    features = torch.randn(4, 12, 16)
    captions = torch.tensor([[START, 5, 6, 7, END], [START, 8, 9, END, 0], [START, 10, 11, 12, END],
                             [START, 7, 6, 5, END]])
    assert memorise(decoder, features, captions, lr=1e-2) < 0.05
    decoded = greedy(decoder.eval(), features, max_length=6, rules=RULES)
    assert [g.tokens for g in decoded] == [[5, 6, 7], [8, 9], [10, 11, 12], [7, 6, 5]]


def test_marginal_attention_needs_a_score():
    with pytest.raises(ValueError, match="marginal attention needs an attention score"):
        make_decoder("none", attention_mode="marginal")


def test_a_marginal_run_trains_captions_and_draws_its_attention(tiny_coco, tmp_path, capsys):
    from captioner.training.engine import train
    from tests.conftest import caption_and_attend, tiny_config

    run = train(tiny_config(tiny_coco, tmp_path / "marginal", train={"epochs": 1}, loss={"label_smoothing": 0.1},
                            model={"lstm": {"attention_mode": "marginal", "marginal_regions": 3}}))
    caption_and_attend(run["checkpoint"], tiny_coco / "images" / "test" / "301.png", tmp_path / "m.png", capsys)
    assert (tmp_path / "m.png").stat().st_size > 0


def test_a_marginal_model_exports_to_onnx_and_captions_as_its_checkpoint(tiny_coco, tmp_path):
    pytest.importorskip("onnxruntime")
    from captioner.cli import main
    from captioner.predictor import Predictor
    from captioner.training.engine import train
    from tests.conftest import tiny_config

    run = train(tiny_config(tiny_coco, tmp_path / "marginal", train={"epochs": 1},
                            model={"lstm": {"attention_mode": "marginal", "marginal_regions": 3,
                                            "marginal_rest": "soft"}}))
    assert main(["export", "--checkpoint", run["checkpoint"], "--out", str(tmp_path / "export"), "--onnx"]) == 0
    images = sorted((tiny_coco / "images" / "test").glob("*.png"))[:4]
    expected = Predictor.load(run["checkpoint"], beam=3).caption(images)
    got = Predictor.load(tmp_path / "export", beam=3, runtime="onnx").caption(images)
    assert [r.caption for r in got] == [r.caption for r in expected]
    assert [r.log_prob for r in got] == pytest.approx([r.log_prob for r in expected], abs=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_soft_rest_of_almost_no_mass_under_half_precision_autocast_is_finite_and_its_likelihood(dtype):
    # all but one region chosen, the last one's alpha far below float16's least: the rest's context is summed as it
    # is, not the soft context less the chosen ones (whose half-precision rounding the tiny mass would divide)
    decoder = make_decoder(attention_mode="marginal", marginal_regions=11, marginal_rest="soft", dropout=0.0).train()
    with torch.no_grad():
        decoder.attention.energy.weight.mul_(60)
    features, captions = torch.randn(3, 12, 16), captions_batch()
    real = captions[:, 1:] != 0
    with torch.no_grad():
        exact = brute_force_log_likelihood(decoder.double(), features.double(), captions)
    decoder.float()
    with torch.autocast("cpu", dtype=dtype):
        out = decoder(features, captions)
        log_p = padded_logits(out, real).gather(2, captions[:, 1:, None]).squeeze(2)
    assert (torch.sort(out.alpha.float(), dim=-1).values[..., 0][real] < 1e-7).any()     # a rest of almost no mass
    assert torch.isfinite(log_p[real]).all()
    torch.testing.assert_close(log_p[real], exact[real], rtol=0, atol=0.05)
    (-log_p[real].sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in decoder.parameters() if p.grad is not None)
