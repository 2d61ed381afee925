"""Variational attention (Deng et al. 2018): a posterior that reads the caption proposes one region per word."""

import pytest
import torch

from captioner.config import LossConfig
from captioner.decoding.search import TokenRules, beam_search
from captioner.objectives.losses import VariationalAttentionLoss, build_loss
from tests.conftest import padded_logits
from tests.test_models import captions_batch, make_decoder

START, END = 1, 2
RULES = TokenRules(START, END)


def variational(**kw):
    return make_decoder(attention_mode="variational", posterior_dim=6, region_norm="layer", **kw)


def posterior_by_hand(decoder, features, captions):
    """q_t (B, T, L) and h_t from the soft recurrence word by word, and the caption reader run on each caption
    alone (no packing)."""
    regions = decoder.prepare_regions(features)
    state, qs = decoder.init_state(features), []
    keys = decoder.posterior.project_regions(regions)
    for t in range(captions.shape[1] - 1):
        rows = []
        for b in range(captions.shape[0]):
            n = int((captions[b, 1:] != 0).sum())
            reading = decoder.caption_reader(decoder.embedding(captions[b : b + 1, 1 : n + 1]))[0]   # (1, n, 2U)
            u = reading[0, min(t, n - 1)]
            rows.append(decoder.posterior(keys[b : b + 1], torch.cat([state["h"][b], u])[None], regions.shape[1]))
        qs.append(torch.cat(rows))
        _, state, _ = decoder.step(captions[:, t], state)
    return torch.stack(qs, 1)


@pytest.mark.parametrize("gate", ["scalar", "none"])
def test_the_posterior_kl_and_the_drawn_words_are_their_definitions(gate):
    decoder = variational(gate=gate).train()
    features, captions = torch.randn(3, 12, 16), captions_batch()
    real = captions[:, 1:] != 0
    torch.manual_seed(0)
    out = decoder(features, captions)
    with torch.no_grad():
        q = posterior_by_hand(decoder, features, captions)
        alpha = out.alpha
        kl = (q * (q.log() - alpha.clamp_min(1e-12).log())).sum(-1)
    torch.testing.assert_close(out.kl[real], kl[real], rtol=1e-4, atol=1e-6)
    assert out.kl[real].min() >= 0
    chosen = q.gather(2, out.locations.unsqueeze(2)).squeeze(2).log()
    torch.testing.assert_close(out.log_prob_location[real], chosen[real], rtol=1e-4, atol=1e-5)   # one region per word
    # the drawn words: the deep output layer at beta a_s, one region per word (dropout 0)
    regions = decoder.prepare_regions(features)
    state, expected = decoder.init_state(features), []
    with torch.no_grad():
        for t in range(captions.shape[1] - 1):
            beta = torch.sigmoid(decoder.gate(state["h"])) if decoder.gate is not None else 1.0
            _, state, _ = decoder.step(captions[:, t], state)
            a = regions[torch.arange(3), out.locations[:, t]]
            expected.append(decoder.output_logits(decoder.embedding(captions[:, t]), state["h"], beta * a))
    drawn = torch.zeros(3, captions.shape[1] - 1, 30).masked_scatter(real[..., None].expand(-1, -1, 30),
                                                                     out.sampled_logits)
    torch.testing.assert_close(drawn[real], torch.stack(expected, 1)[real], rtol=1e-4, atol=1e-5)


def test_the_loss_is_the_soft_term_the_bound_and_reinforce_against_the_soft_context():
    decoder = variational().train()
    features, captions = torch.randn(3, 12, 16), captions_batch()
    targets, real = captions[:, 1:], captions[:, 1:] != 0
    torch.manual_seed(1)
    out = decoder(features, captions)
    loss = VariationalAttentionLoss(LossConfig(doubly_stochastic=0.0, reinforce_scale=0.5))(out, targets)
    soft = torch.log_softmax(padded_logits(out, real), -1).gather(2, targets[..., None]).squeeze(2)
    drawn_logits = torch.zeros(*real.shape, 30).masked_scatter(real[..., None].expand(-1, -1, 30), out.sampled_logits)
    drawn = torch.log_softmax(drawn_logits, -1).gather(2, targets[..., None]).squeeze(2)
    words = real.sum()
    reinforce = -0.5 * ((drawn - soft).detach() * out.log_prob_location)[real].sum() / words
    expected = -soft[real].sum() / words - drawn[real].sum() / words + reinforce + out.kl[real].sum() / words
    torch.testing.assert_close(loss["reinforce"], reinforce)
    torch.testing.assert_close(loss["loss"], expected)
    torch.testing.assert_close(loss["cross_entropy"], -soft[real].mean())
    # the posterior and its caption reader learn from REINFORCE and the KL; alpha's score from the KL too
    loss["loss"].backward()
    for name in ("caption_reader.weight_ih_l0", "caption_reader.weight_hh_l0_reverse", "posterior.region_proj.weight",
                 "attention.region_proj.weight", "out_context.weight"):
        assert dict(decoder.named_parameters())[name].grad.abs().sum() > 0, name


def test_out_of_training_it_is_soft_attention_and_decodes_as_soft_attention():
    decoder, soft = variational().eval(), make_decoder(region_norm="layer").eval()
    soft.load_state_dict({k: v for k, v in decoder.state_dict().items() if not k.startswith(("caption_reader",
                                                                                               "posterior"))})
    features, captions = torch.randn(3, 12, 16), captions_batch()
    with torch.no_grad():
        out = decoder(features, captions)
        torch.testing.assert_close(out.logits, soft(features, captions).logits)
        assert out.sampled_logits is None and isinstance(build_loss(decoder, LossConfig()), VariationalAttentionLoss)
        a = beam_search(decoder, features, beam=3, max_length=8, rules=RULES)
        b = beam_search(soft, features, beam=3, max_length=8, rules=RULES)
    assert [x.tokens for x in a] == [y.tokens for y in b]


def test_a_variational_run_trains_and_captions(tiny_coco, tmp_path, capsys):
    import json

    from captioner.training.engine import train
    from tests.conftest import caption_and_attend, tiny_config

    run = train(tiny_config(tiny_coco, tmp_path / "variational", train={"epochs": 1},
                            model={"lstm": {"attention_mode": "variational", "posterior_dim": 8}}))
    records = [json.loads(line) for line in (tmp_path / "variational" / "metrics.jsonl").read_text().splitlines()]
    assert any("kl" in r and "reinforce" in r for r in records if r["type"] == "train")
    caption_and_attend(run["checkpoint"], tiny_coco / "images" / "test" / "301.png", None, capsys)


def test_the_kl_keeps_its_value_and_gradient_where_alpha_is_below_what_float32_holds():
    # a sharp prior: most of alpha's regions far below 1e-12, where a clamped alpha's log has no gradient
    decoder = variational().train()
    with torch.no_grad():
        decoder.attention.energy.weight.mul_(400)
    features, captions = torch.randn(3, 12, 16), captions_batch()
    real = captions[:, 1:] != 0
    torch.manual_seed(0)
    out = decoder(features, captions)
    assert out.alpha[real].min() < 1e-12
    # the same KL in float64 from the scores: log alpha and log q by log-softmax
    with torch.no_grad():
        q = posterior_by_hand(decoder, features, captions).double()
        scores, state = [], decoder.init_state(features)
        regions = decoder.prepare_regions(features)
        for t in range(captions.shape[1] - 1):
            scores.append(decoder.attention.scores(state["keys"], state["h"], regions.shape[1]))
            _, state, _ = decoder.step(captions[:, t], state)
        log_alpha = torch.log_softmax(torch.stack(scores, 1).double(), -1)
        kl = (q * (q.log() - log_alpha)).sum(-1)
    torch.testing.assert_close(out.kl[real].double(), kl[real], rtol=1e-4, atol=1e-4)
    out.kl[real].sum().backward()                                               # and it trains alpha's scores
    assert decoder.attention.energy.weight.grad.abs().sum() > 0
