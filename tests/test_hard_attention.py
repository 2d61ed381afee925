"""Stochastic hard attention (Xu et al. §4.1): sampling, the REINFORCE estimator, its baseline, decoding."""

import pytest
import torch

from captioner.config import LossConfig, load_config
from captioner.decoding.search import TokenRules, beam_search, greedy
from captioner.errors import CaptionerError
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.objectives.losses import HardAttentionLoss, caption_baseline
from tests.conftest import padded_logits

START, END = 1, 2
RULES = TokenRules(START, END)


def make_hard(**kw) -> LSTMDecoder:
    torch.manual_seed(0)
    options = dict(vocab_size=12, region_dim=6, grid=(2, 3), attention="additive", attention_dim=8, embed_dim=8,
                   hidden_dim=10, dropout=0.0, attention_mode="hard")
    options.update(kw)
    return LSTMDecoder(LSTMDecoderConfig(**options))


def hard_loss(**kw) -> HardAttentionLoss:
    return HardAttentionLoss(LossConfig(**{"doubly_stochastic": 0.0, "entropy_weight": 0.0, **kw}))


CAPTIONS = torch.tensor([[START, 5, 6, END, 0], [START, 7, 8, 9, END], [START, 4, END, 0, 0]])


def test_training_output_and_expectation_mixing_probability():
    decoder = make_hard().train()
    torch.manual_seed(1)
    features = torch.randn(3, 6, 6)
    out = decoder(features, CAPTIONS)
    assert out.log_prob_location.shape == (3, 4) and out.entropy.shape == (3, 4)
    # Over many captions, about half use the expected location (the paper's variance reduction).
    big = decoder(torch.randn(4000, 6, 6), torch.tensor([[START, 5, END]]).expand(4000, -1))
    fraction = big.expectation_rows.float().mean().item()
    assert abs(fraction - 0.5) < 4 * (0.25 / 4000) ** 0.5  # within 4 standard deviations
    decoder.config.expectation_probability = 0.0
    assert not decoder(features, CAPTIONS).expectation_rows.any()


def test_several_location_samples_repeat_each_sampled_caption():
    decoder = make_hard(location_samples=3, expectation_probability=0.0).train()
    out = decoder(torch.randn(3, 6, 6), CAPTIONS)
    assert out.alpha.shape[0] == 9 and out.logits.shape[0] == 3 * (3 + 4 + 2) and out.repeats.tolist() == [3, 3, 3]
    loss = hard_loss()(out, CAPTIONS[:, 1:])
    assert int(loss["words"]) == 3 * (3 + 4 + 2)
    # a caption on the expectation is not repeated: its draws would all be the same pass
    decoder.config.expectation_probability = 0.5
    torch.manual_seed(5)
    out = decoder(torch.randn(40, 6, 6), torch.tensor([[START, 5, END]]).expand(40, -1))
    assert set(out.repeats.tolist()) == {1, 3} and out.alpha.shape[0] == int(out.repeats.sum())
    torch.testing.assert_close(out.expectation_rows, (out.repeats == 1).repeat_interleave(out.repeats))
    assert int(hard_loss()(out, torch.tensor([[5, END]]).expand(40, -1))["words"]) == 2 * int(out.repeats.sum())


def test_sampled_context_is_the_chosen_region():
    decoder = make_hard(gate="none").train()
    regions = torch.randn(2, 6, 6)
    h = torch.randn(2, 10)
    keys = decoder.attention.project_regions(regions)
    z, alpha, info = decoder.context(regions, keys, h, torch.tensor([False, True]))
    chosen = info["chosen"].argmax(-1)
    torch.testing.assert_close(z[0], regions[0, chosen[0]])
    torch.testing.assert_close(z[1], (alpha[1, :, None] * regions[1]).sum(0))


def test_reinforce_gradient_reaches_attention_and_reward_is_detached():
    """With every location sampled, the attention scorer's gradient is exactly the REINFORCE term's:
    the likelihood path does not reach it (z = a_s has no alpha in it), and the reward carries no gradient."""
    decoder = make_hard(expectation_probability=0.0).train()
    features = torch.randn(3, 6, 6)
    targets = CAPTIONS[:, 1:]
    torch.manual_seed(3)
    out = decoder(features, CAPTIONS)
    objective = hard_loss()
    objective.baseline.fill_(-5.0)
    objective.baseline_updates.fill_(1)
    loss = objective(out, targets)
    energy = decoder.attention.energy.weight
    (grad_total,) = torch.autograd.grad(loss["loss"], energy, retain_graph=True)
    (grad_reinforce,) = torch.autograd.grad(loss["reinforce"], energy, retain_graph=True)
    (grad_likelihood,) = torch.autograd.grad(loss["cross_entropy"], energy, retain_graph=True, allow_unused=True)
    assert grad_reinforce.abs().sum() > 0
    torch.testing.assert_close(grad_total, grad_reinforce)
    assert grad_likelihood is None or grad_likelihood.abs().sum() == 0
    # The output layer learns from the likelihood only.
    (grad_out,) = torch.autograd.grad(loss["reinforce"], decoder.out_words.weight, allow_unused=True)
    assert grad_out is None or grad_out.abs().sum() == 0
    # REINFORCE by hand: -(reward - b) * sum_t log alpha_t[s_t], over real words.
    mask = targets != 0
    reward = -torch.nn.functional.cross_entropy(padded_logits(out, mask).transpose(1, 2), targets,
                                                reduction="none").mul(mask).sum(1)
    manual = -((reward.detach() + 5.0) * (out.log_prob_location * mask).sum(1)).sum() / mask.sum()
    torch.testing.assert_close(loss["reinforce"], manual)


def test_baseline_follows_running_mean_of_reward():
    decoder = make_hard(expectation_probability=0.0).train()
    expected, objective = None, hard_loss(baseline_decay=0.9)
    for step in range(6):
        out = decoder(torch.randn(3, 6, 6), CAPTIONS)
        loss = objective(out, CAPTIONS[:, 1:])
        reward = loss["reward"].item()
        used = reward if expected is None else expected  # the baseline compared with this batch's reward
        assert loss["baseline"].item() == pytest.approx(used, rel=1e-5)
        expected = 0.9 * used + 0.1 * reward
        assert objective.baseline.item() == pytest.approx(expected, rel=1e-5)
    objective.eval()                                       # evaluation leaves the baseline alone
    objective(decoder(torch.randn(3, 6, 6), CAPTIONS), CAPTIONS[:, 1:])
    assert objective.baseline.item() == pytest.approx(expected, rel=1e-5) and objective.baseline_updates == 6


def test_per_word_reward_is_the_log_likelihood_divided_by_caption_length():
    decoder = make_hard(expectation_probability=0.0).train()
    torch.manual_seed(1)
    out = decoder(torch.randn(3, 6, 6), CAPTIONS)
    targets = CAPTIONS[:, 1:]
    sequence = hard_loss()(out, targets)["reward"]
    per_word = hard_loss(hard_reward="per_word")(out, targets)["reward"]
    # rewards are reported as the batch mean; recompute both from the logits
    log_probs = torch.log_softmax(padded_logits(out, targets != 0), -1)
    token_log_probs = log_probs.gather(2, targets.unsqueeze(2)).squeeze(2) * (targets != 0)
    lengths = (targets != 0).sum(1)
    assert sequence.item() == pytest.approx(token_log_probs.sum(1).mean().item(), rel=1e-5)
    assert per_word.item() == pytest.approx((token_log_probs.sum(1) / lengths).mean().item(), rel=1e-5)
    with pytest.raises(CaptionerError, match="loss.hard_reward must be sequence, per_word or word, got 'per_token'"):
        load_config(None, ["loss.hard_reward=per_token"])       # refused when the config is read


def test_label_smoothing_mixes_uniform_targets_into_the_likelihood_term_not_into_the_reward():
    decoder = make_hard(expectation_probability=0.5).train()
    torch.manual_seed(1)
    out = decoder(torch.randn(3, 6, 6), CAPTIONS)
    targets = CAPTIONS[:, 1:]
    plain, smoothed = hard_loss()(out, targets), hard_loss(label_smoothing=0.1)(out, targets)
    real = targets != 0
    spread = -torch.log_softmax(padded_logits(out, real), -1)[real].mean(-1).sum() / real.sum()
    for name in ("cross_entropy", "reward", "reinforce", "words"):     # reported and REINFORCE terms: unsmoothed
        torch.testing.assert_close(smoothed[name], plain[name])
    torch.testing.assert_close(smoothed["loss"], plain["loss"] + 0.1 * (spread - plain["cross_entropy"]))
    assert not torch.isclose(smoothed["loss"], plain["loss"])


@pytest.mark.parametrize("baseline", ["none", "caption"])
def test_a_word_reward_pays_each_location_its_own_words_log_likelihood(baseline):
    """capgen.py's estimator: the location of word t is reinforced by log p(y_t | s, a) alone, scaled; with two
    samples per caption, against the other sample's reward at the same word."""
    decoder = make_hard(expectation_probability=0.5, location_samples=2).train()
    torch.manual_seed(3)
    out = decoder(torch.randn(3, 6, 6), CAPTIONS)
    targets = CAPTIONS[:, 1:].repeat_interleave(out.repeats, 0)
    loss = hard_loss(hard_reward="word", hard_baseline=baseline, reinforce_scale=0.5)(out, CAPTIONS[:, 1:])
    real = targets != 0
    word = torch.log_softmax(padded_logits(out, real), -1).gather(2, targets.unsqueeze(2)).squeeze(2) * real
    word_advantage = word
    if baseline == "caption":       # a sampled caption's two rows: each against the other at the same word
        pairs = out.repeats.repeat_interleave(out.repeats) == 2
        other = word.clone()
        for row, n in zip((torch.cumsum(out.repeats, 0) - out.repeats).tolist(), out.repeats.tolist()):
            if n == 2:
                other[row], other[row + 1] = word[row + 1], word[row]
        word_advantage = torch.where(pairs[:, None], word - other, word)
        assert pairs.any()
    counted = ~out.expectation_rows[:, None] & real
    expected = -0.5 * (word_advantage * counted * out.log_prob_location * real).sum() / real.sum()
    torch.testing.assert_close(loss["reinforce"], expected)
    assert loss["reinforce"].abs() > 0
    torch.testing.assert_close(loss["reward"], word[real].mean())


def test_the_expectation_drawn_once_per_step_holds_for_all_its_captions():
    decoder = make_hard(expectation_draw="batch").train()
    features, captions = torch.randn(6, 6, 6), torch.cat([CAPTIONS, CAPTIONS])
    torch.manual_seed(0)
    draws = [decoder(features, captions).expectation_rows for _ in range(200)]
    assert all(d.all() or not d.any() for d in draws)                    # all on the expectation, or none
    assert 70 < sum(bool(d.all()) for d in draws) < 130                  # half of the steps (p = 0.5)
    decoder = make_hard().train()                                        # per caption: mixed within a step
    assert any(d.any() and not d.all() for d in (decoder(features, captions).expectation_rows for _ in range(20)))


def test_entropy_bonus_raises_entropy():
    decoder = make_hard(expectation_probability=0.0).train()
    features = torch.randn(8, 6, 6)
    captions = torch.tensor([[START, 5, 6, END]]).expand(8, -1)
    optimizer = torch.optim.SGD(decoder.attention.parameters(), lr=0.5)

    def mean_entropy():
        with torch.no_grad():
            return decoder(features, captions).entropy.mean().item()

    before = mean_entropy()
    for _ in range(20):
        out = decoder(features, captions)
        loss = hard_loss(entropy_weight=1.0)(out, captions[:, 1:])
        optimizer.zero_grad()
        (-loss["entropy"] * 1.0).backward()  # the entropy part of the loss on its own: minimising it raises H
        optimizer.step()
    assert mean_entropy() > before
    out = decoder(features, captions)
    full = hard_loss(entropy_weight=1.0)(out, captions[:, 1:])
    assert torch.isclose(full["loss"], full["cross_entropy"] + full["reinforce"] - full["entropy"])


def test_reinforce_learns_to_attend_to_the_informative_region():
    """Toy task: only region 0 says which word comes (its first feature is +1 or -1); the other regions are
    noise. The initial state is made blind (it would otherwise see region 0 through the mean of the regions),
    so the word can only be read through the sampled location: the attention must learn, through the
    REINFORCE estimator alone, to put its mass on region 0."""
    torch.manual_seed(0)
    decoder = make_hard(expectation_probability=0.0, gate="none", region_dim=4, grid=(1, 6), vocab_size=6)
    for layer in (decoder.init_h, decoder.init_c):
        layer.weight.data.zero_()
        layer.weight.requires_grad_(False)
    optimizer = torch.optim.Adam([p for p in decoder.parameters() if p.requires_grad], lr=0.01)

    def batch(n=64):
        features = torch.randn(n, 6, 4) * 0.5
        sign = torch.randint(0, 2, (n,))
        features[:, 0, 0] = sign.float() * 2 - 1
        features[:, 0, 1:] = 3.0  # makes region 0 recognisable
        captions = torch.stack([torch.full((n,), START), 4 + sign, torch.full((n,), END)], 1)
        return features, captions

    def attention_on_informative():
        decoder.eval()
        features, captions = batch(256)
        with torch.no_grad():
            alpha = decoder(features, captions).alpha[:, 0]
        decoder.train()
        return alpha[:, 0].mean().item()

    before, objective = attention_on_informative(), hard_loss()
    for _ in range(300):
        features, captions = batch()
        out = decoder(features, captions)
        loss = objective(out, captions[:, 1:])
        optimizer.zero_grad()
        loss["loss"].backward()
        optimizer.step()
    after = attention_on_informative()
    assert before < 0.3 and after > 0.8


def test_argmax_decoding_gives_one_hot_per_word_and_beam_one_equals_greedy():
    decoder = make_hard().eval()
    features = torch.randn(4, 6, 6)
    generations = greedy(decoder, features, max_length=6, rules=RULES)
    beams = beam_search(decoder, features, beam=1, max_length=6, rules=RULES)
    for g, b in zip(generations, beams):
        chosen = g.attention["chosen"]
        assert chosen.shape == (len(g.tokens), 6)
        assert chosen.sum(-1).eq(1).all() and chosen.max(-1).values.eq(1).all()
        torch.testing.assert_close(chosen.argmax(-1), g.attention["alpha"].argmax(-1))
        assert g.tokens == b.tokens


def test_expectation_decoding_is_the_soft_context_of_the_same_weights():
    """hard_decode=expectation decodes with alpha's mean of the regions (the expectation rows' context): the
    same words, log-probabilities and alpha as the soft decoder with the same weights, and no chosen cell."""
    hard = make_hard(hard_decode="expectation").eval()
    soft = make_hard(attention_mode="soft").eval()
    soft.load_state_dict(hard.state_dict())
    features = torch.randn(4, 6, 6)
    for ours, theirs in zip(beam_search(hard, features, beam=3, max_length=6, rules=RULES),
                            beam_search(soft, features, beam=3, max_length=6, rules=RULES)):
        assert ours.tokens == theirs.tokens and "chosen" not in ours.attention
        torch.testing.assert_close(ours.log_prob, theirs.log_prob)
        torch.testing.assert_close(ours.attention["alpha"], theirs.attention["alpha"])
    # training still samples: the location terms REINFORCE needs are there
    out = hard.train()(features, CAPTIONS[:, :4].repeat(2, 1)[:4])
    assert out.log_prob_location is not None


def test_caption_baseline_is_the_mean_reward_of_the_captions_other_samples():
    """loss.hard_baseline=caption: each sample's advantage is its reward minus the mean of the same caption's other
    M - 1 samples, so a caption whose samples all score alike teaches the attention nothing."""
    decoder = make_hard(expectation_probability=0.0, location_samples=3).train()
    torch.manual_seed(2)
    out = decoder(torch.randn(3, 6, 6), CAPTIONS)
    targets = CAPTIONS[:, 1:].repeat_interleave(3, 0)
    mask = targets != 0
    loss = hard_loss(hard_baseline="caption", hard_reward="per_word")(out, CAPTIONS[:, 1:])
    log_probs = torch.log_softmax(padded_logits(out, mask), -1).gather(2, targets.unsqueeze(2)).squeeze(2)
    reward = ((log_probs * mask).sum(1) / mask.sum(1)).detach().view(3, 3)
    others = (reward.sum(1, keepdim=True) - reward) / 2
    manual = -((reward - others).reshape(-1) * (out.log_prob_location * mask).sum(1)).sum() / mask.sum()
    torch.testing.assert_close(loss["reinforce"], manual)
    same = torch.full((6,), -2.0)
    assert caption_baseline(same, torch.tensor([3, 3])).eq(-2.0).all()
    # captions of one row (on the expectation) and of several, side by side: each compared with its own rows only
    reward, repeats = torch.tensor([1.0, 2.0, 4.0, 7.0, 3.0, 5.0]), torch.tensor([2, 1, 3])
    torch.testing.assert_close(caption_baseline(reward, repeats),
                               torch.tensor([2.0, 1.0, 0.0, 4.0, 6.0, 5.0]))


def test_caption_baseline_needs_several_location_samples():
    with pytest.raises(CaptionerError, match="location_samples to 2 or more"):
        load_config(None, ["model.lstm.attention_mode=hard", "loss.hard_baseline=caption"])
    config = load_config(None, ["model.lstm.attention_mode=hard", "loss.hard_baseline=caption",
                                "model.lstm.location_samples=2"])
    assert config.loss.hard_baseline == "caption"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_sharp_alpha_under_half_precision_autocast_gives_a_finite_loss_and_gradient(dtype):
    # float16 holds nothing below 6e-8: a sharp alpha underflows there, and a log of it would be -inf, its
    # entropy 0 * -inf = NaN (the precision that GPUs without bf16 train in)
    decoder = make_hard(expectation_probability=0.0).train()
    with torch.no_grad():
        decoder.attention.energy.weight.mul_(40)
    torch.manual_seed(1)
    features = torch.randn(3, 6, 6)
    with torch.autocast("cpu", dtype=dtype):
        out = decoder(features, CAPTIONS)
        loss = hard_loss(entropy_weight=0.01)(out, CAPTIONS[:, 1:])
    real = CAPTIONS[:, 1:] != 0
    assert (out.alpha[real].float() < 6e-8).any()                               # some regions below float16's least
    assert torch.isfinite(out.entropy[real]).all() and torch.isfinite(out.log_prob_location[real]).all()
    assert torch.isfinite(loss["loss"])
    loss["loss"].backward()
    assert all(torch.isfinite(p.grad).all() for p in decoder.parameters() if p.grad is not None)
    # the log-probabilities are alpha's own, in float32
    torch.testing.assert_close(out.entropy[real], -(out.alpha.float() * out.alpha.float().clamp_min(1e-30).log()
                                                    ).sum(-1)[real], rtol=2e-2, atol=2e-2)
