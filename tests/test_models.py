"""Attention, the soft-attention LSTM decoder, its loss, and the searches that decode it."""

from types import SimpleNamespace

import pytest
import torch

from captioner.decoding.search import TokenRules, beam_search, greedy
from captioner.models.attention import SCORES, RegionAttention
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.models.positions import grid_code
from captioner.models.transformer_decoder import (
    TransformerDecoder,
    TransformerDecoderConfig,
)
from captioner.objectives.losses import caption_loss
from tests.conftest import memorise, padded_logits

START, END = 1, 2
RULES = TokenRules(START, END)


def make_decoder(attention="additive", vocab=30, dim=16, grid=(3, 4), dropout=0.0, **kw) -> LSTMDecoder:
    torch.manual_seed(0)
    config = LSTMDecoderConfig(vocab_size=vocab, region_dim=dim, grid=grid, attention=attention, attention_dim=12,
                               embed_dim=10, hidden_dim=14, dropout=dropout, **kw)
    return LSTMDecoder(config)


@pytest.mark.parametrize("score", SCORES)
def test_attention_sums_to_one(score):
    torch.manual_seed(0)
    attention = RegionAttention(score, region_dim=6, query_dim=5, attention_dim=4)
    regions, query = torch.randn(3, 7, 6), torch.randn(3, 5)
    alpha = attention(attention.project_regions(regions), query, 7)
    assert alpha.shape == (3, 7) and alpha.ge(0).all()
    torch.testing.assert_close(alpha.sum(-1), torch.ones(3))
    if score == "none":
        torch.testing.assert_close(alpha[1], torch.full((7,), 1 / 7))


def test_additive_score_matches_formula():
    torch.manual_seed(0)
    attention = RegionAttention("additive", 6, 5, 4)
    regions, query = torch.randn(2, 3, 6), torch.randn(2, 5)
    expected = attention.energy(torch.tanh(attention.region_proj(regions) + attention.query_proj(query)[:, None]))[..., 0]
    torch.testing.assert_close(attention(attention.project_regions(regions), query, 3), expected.softmax(-1))


def test_position_code_distinct_per_cell():
    code = grid_code((3, 5), 16)
    assert code.shape == (15, 16)
    assert torch.cdist(code, code).add(torch.eye(15)).min() > 1e-3


def captions_batch():
    captions = torch.tensor([[START, 5, 6, 7, END, 0, 0], [START, 8, END, 0, 0, 0, 0], [START, 5, 5, 5, 5, 5, END]])
    return captions


def test_forward_shapes_alpha_rows_sum_to_one_and_padding_steps_attend_nowhere():
    decoder = make_decoder(region_position="sinusoidal", position_dim=8).eval()
    captions = captions_batch()
    out = decoder(torch.randn(3, 12, 16), captions)
    assert out.logits.shape == (12, 30) and out.alpha.shape == (3, 6, 12)   # logits at the 4 + 2 + 6 real words
    real = captions[:, 1:] != 0
    torch.testing.assert_close(out.alpha.sum(-1), real.float())


@pytest.mark.parametrize("kind", ["additive", "none", "hard", "marginal"])
def test_teacher_forced_batch_equals_each_caption_alone(kind):
    """The batch runs longest caption first with a shrinking set of rows; each row must still be its own."""
    mode = kind if kind in ("hard", "marginal") else "soft"
    decoder = make_decoder("additive" if mode != "soft" else kind, attention_mode=mode).eval()
    features = torch.randn(5, 12, 16)
    captions = torch.tensor([[START, 5, END, 0, 0, 0, 0], [START, 5, 6, 7, 8, 9, END], [START, 4, 4, END, 0, 0, 0],
                             [START, 9, 8, 7, 6, END, 0], [START, 5, 6, 7, 8, 9, END]])
    with torch.no_grad():
        together = decoder(features, captions)
        for row in range(5):
            n = int((captions[row, 1:] != 0).sum())
            alone = decoder(features[row : row + 1], captions[row : row + 1, : n + 1])
            logits = padded_logits(together, captions[:, 1:] != 0)
            torch.testing.assert_close(logits[row, :n], alone.logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(together.alpha[row, :n], alone.alpha[0], rtol=1e-5, atol=1e-6)
            assert together.alpha[row, n:].eq(0).all()


def test_one_node_for_all_prefixes_gives_the_gradients_of_plain_slices(monkeypatch):
    from captioner.models import lstm_decoder

    features, captions = torch.randn(3, 12, 16), captions_batch()

    def gradients():
        decoder = make_decoder(region_norm="layer")
        out = decoder(features, captions)
        caption_loss(out.logits, captions[:, 1:], out.alpha, 1.0)["loss"].backward()
        return {name: p.grad.clone() for name, p in decoder.named_parameters() if p.grad is not None}

    fused = gradients()
    monkeypatch.setattr(lstm_decoder, "prefixes", lambda tensor, sizes: [None if tensor is None else tensor[:n] for n in sizes])
    sliced = gradients()
    assert fused.keys() == sliced.keys() and "attention.region_proj.weight" in fused
    for name in fused:
        torch.testing.assert_close(fused[name], sliced[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("norm", ["layer", "image"])
def test_region_norm_makes_the_decoder_blind_to_the_features_scale(norm):
    decoder = make_decoder(region_norm=norm, dropout=0.0).eval()
    features, captions = torch.randn(3, 12, 16), captions_batch()
    small, large = decoder(features, captions), decoder(features * torch.tensor([100.0, 2.0, 7.0])[:, None, None],
                                                        captions)
    torch.testing.assert_close(small.logits, large.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(small.alpha, large.alpha, rtol=1e-4, atol=1e-5)


def test_image_norm_keeps_the_regions_relative_strengths():
    norm = make_decoder(region_norm="image").region_norm
    features = torch.randn(2, 12, 16).relu() * torch.linspace(0.0, 50.0, 12)[:, None]     # region 0 silent
    normed = norm(features)
    assert normed.shape == features.shape
    assert torch.equal(normed[:, 0], torch.zeros(2, 16))                                # nothing stays nothing
    ratio = normed.norm(dim=2) / features.norm(dim=2).clamp_min(1e-9)                   # one scale per image
    torch.testing.assert_close(ratio[:, 1:], ratio[:, 1:2].expand(-1, 11))
    torch.testing.assert_close(normed.pow(2).mean(dim=(1, 2)), torch.ones(2))           # unit mean square


def test_word_and_region_dropout_act_in_training_only_and_drop_what_they_name():
    plain = make_decoder(region_norm="layer")
    dropped = make_decoder(region_norm="layer", word_dropout=0.5, region_dropout=0.5)
    dropped.load_state_dict(plain.state_dict())          # strict: the dropouts have no parameters of their own
    features, captions = torch.randn(3, 12, 16), captions_batch()
    plain.eval()
    dropped.eval()
    torch.testing.assert_close(dropped(features, captions).logits, plain(features, captions).logits)
    dropped.train()
    regions, words = dropped.prepare_regions(features), dropped.embed(captions)
    normed, embedded = plain.prepare_regions(features), plain.embedding(captions)
    for out, clean in ((regions, normed), (words, embedded)):
        kept = out != 0
        assert 0.3 < kept.float().mean() < 0.7                            # about half dropped
        torch.testing.assert_close(out[kept], 2 * clean[kept])           # the rest scaled by 1 / (1 - p)


def test_region_embed_is_what_everything_reads():
    decoder = make_decoder(region_norm="layer", region_embed=8, region_position="sinusoidal", position_dim=4).eval()
    features = torch.randn(3, 12, 16)
    regions = decoder.prepare_regions(features)
    assert regions.shape == (3, 12, 8 + 4) and decoder.context_dim == 12
    embedded = regions[..., :8]
    torch.testing.assert_close(embedded, torch.relu(decoder.region_embed[0](decoder.region_norm(features))))
    assert (embedded >= 0).all() and (embedded == 0).any()              # ReLU(W_e a + b_e): sparse, non-negative
    assert decoder.init_h.in_features == decoder.recurrent_gates.in_features - 14 == 12   # H = 14
    assert decoder(features, captions_batch()).logits.shape == (12, 30)


def test_loss_ignores_padding():
    decoder = make_decoder().eval()
    features, captions = torch.randn(3, 12, 16), captions_batch()
    mask = captions[:, 1:] != 0
    out = decoder(features, captions)
    packed = caption_loss(out.logits, captions[:, 1:], out.alpha, 1.0)
    garbage = padded_logits(out, mask).masked_fill(~mask.unsqueeze(-1), 100.0)   # whatever sits at padding
    torch.testing.assert_close(caption_loss(garbage, captions[:, 1:], out.alpha, 1.0)["loss"], packed["loss"])
    assert int(packed["words"]) == 4 + 2 + 6 and out.logits.shape[0] == 12


def test_doubly_stochastic_term_by_hand():
    logits = torch.zeros(2, 3, 5)
    targets = torch.tensor([[3, 4, 0], [3, 0, 0]])
    alpha = torch.tensor([[[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]],
                          [[0.2, 0.8], [0.9, 0.1], [0.3, 0.7]]])
    # coverage over real steps only: image 0 -> (1.5, 0.5), image 1 -> (0.2, 0.8)
    expected = ((1 - 1.5) ** 2 + (1 - 0.5) ** 2 + (1 - 0.2) ** 2 + (1 - 0.8) ** 2) / 2
    out = caption_loss(logits, targets, alpha, doubly_stochastic=2.0)
    torch.testing.assert_close(out["attention"], torch.tensor(2.0 * expected))
    torch.testing.assert_close(out["cross_entropy"], torch.log(torch.tensor(5.0)))


def test_doubly_stochastic_per_word_scale_divides_by_real_words():
    logits = torch.zeros(2, 3, 5)
    targets = torch.tensor([[3, 4, 0], [3, 0, 0]])
    alpha = torch.tensor([[[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]],
                          [[0.2, 0.8], [0.9, 0.1], [0.3, 0.7]]])
    per_caption = caption_loss(logits, targets, alpha, doubly_stochastic=2.0)["attention"]
    per_word = caption_loss(logits, targets, alpha, doubly_stochastic=2.0, doubly_stochastic_scale="word")["attention"]
    torch.testing.assert_close(per_word, per_caption * 2 / 3)           # 2 captions, 3 real words


def test_doubly_stochastic_term_has_the_gradient_of_a_coverage_target_of_t_over_l():
    """sum_i (1 - c_i)^2 and sum_i (T/L - c_i)^2 differ by a constant when sum_i c_i = T: same gradient."""
    torch.manual_seed(0)
    scores = torch.randn(1, 5, 12, requires_grad=True)
    alpha = scores.softmax(-1)
    mask = torch.ones(1, 5, dtype=torch.bool)
    from captioner.objectives.losses import doubly_stochastic_term

    (paper,) = torch.autograd.grad(doubly_stochastic_term(alpha, mask, 1.0), scores, retain_graph=True)
    coverage = alpha.sum(1)
    (target,) = torch.autograd.grad(((5 / 12 - coverage) ** 2).sum(), scores)
    torch.testing.assert_close(paper, target)


def test_relu_activation_in_the_additive_score():
    torch.manual_seed(0)
    attention = RegionAttention("additive", 6, 5, 4, activation="relu")
    regions, query = torch.randn(2, 3, 6), torch.randn(2, 5)
    expected = attention.energy(torch.relu(attention.region_proj(regions) + attention.query_proj(query)[:, None]))[..., 0]
    torch.testing.assert_close(attention(attention.project_regions(regions), query, 3), expected.softmax(-1))
    with pytest.raises(ValueError, match="activation"):
        RegionAttention("additive", 6, 5, 4, activation="gelu")


def test_label_smoothing_mixes_uniform_targets_and_still_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    targets = torch.tensor([[4, 5, 2, 0], [6, 2, 0, 0]])
    real = targets != 0
    out = caption_loss(logits, targets, None, 0.0, label_smoothing=0.1)
    expected = torch.nn.functional.cross_entropy(logits[real], targets[real], label_smoothing=0.1)
    torch.testing.assert_close(out["loss"], expected)
    # the reported cross-entropy stays the plain negative log-likelihood
    torch.testing.assert_close(out["cross_entropy"], torch.nn.functional.cross_entropy(logits[real], targets[real]))
    padded = logits.clone()
    padded[~real] = 100.0
    torch.testing.assert_close(caption_loss(padded, targets, None, 0.0, label_smoothing=0.1)["loss"], expected)


@pytest.mark.parametrize("score", ["additive", "general", "none"])
def test_beam_one_equals_greedy(score):
    decoder = make_decoder(score).eval()
    features = torch.randn(6, 12, 16)
    g = greedy(decoder, features, max_length=12, rules=RULES)
    b = beam_search(decoder, features, beam=1, max_length=12, rules=RULES)
    for x, y in zip(g, b):
        assert x.tokens == y.tokens
        assert x.log_prob == pytest.approx(y.log_prob, abs=1e-5)
        torch.testing.assert_close(x.attention["alpha"], y.attention["alpha"])


def test_batched_beam_equals_one_at_a_time():
    decoder = make_decoder().eval()
    features = torch.randn(5, 12, 16)
    together = beam_search(decoder, features, beam=3, max_length=10, rules=RULES)
    for i in range(5):
        (alone,) = beam_search(decoder, features[i : i + 1], beam=3, max_length=10, rules=RULES)
        assert alone.tokens == together[i].tokens
        assert alone.log_prob == pytest.approx(together[i].log_prob, abs=1e-4)
        assert alone.attention["alpha"].shape == (len(alone.tokens), 12)


class EndsWhenDue:
    """A decoder that avoids <end> until a step set by each image's regions (a fixed state, ``due``) and wants it
    after, so that the images of a batch finish their searches at different steps."""

    def __init__(self, decoder):
        self.decoder, self.fixed_state = decoder, (*decoder.fixed_state, "due")

    def init_state(self, regions):
        due = (regions[:, :, 0].abs().sum(1, keepdim=True) * 3).floor() % 9 + 2            # (B, 1): 2 to 10
        return {**self.decoder.init_state(regions), "due": due, "t": regions.new_zeros(regions.shape[0], 1)}

    def step(self, tokens, state):
        log_probs, inner, attention = self.decoder.step(tokens, {k: v for k, v in state.items() if k not in ("due", "t")})
        due = state["due"].repeat_interleave(tokens.shape[0] // state["due"].shape[0], 0)
        t = state["t"] + 1
        bonus = torch.zeros_like(log_probs)
        bonus[:, END] = 10 * (t - due).clamp(-1, 1).squeeze(1)
        return torch.log_softmax(log_probs + bonus, dim=1), {**inner, "due": state["due"], "t": t}, attention


def test_images_leave_the_beam_search_when_done_and_get_the_answers_of_a_search_alone():
    paced = EndsWhenDue(make_decoder().eval())
    features = torch.randn(6, 12, 16, generator=torch.Generator().manual_seed(3))
    rows = []

    def step(tokens, state):
        rows.append(tokens.shape[0])
        assert state["due"].shape[0] * 3 == tokens.shape[0]     # the fixed state shrinks with the images
        return paced.step(tokens, state)

    counted = SimpleNamespace(init_state=paced.init_state, step=step, fixed_state=paced.fixed_state)
    together = beam_search(counted, features, beam=3, max_length=14, rules=RULES, n_best=3)
    assert len({len(g.tokens) for g in together}) > 2            # the images finish at different steps
    assert rows[0] == 18 and rows == sorted(rows, reverse=True) and len(set(rows)) > 2   # and leave as they do
    for i, generation in enumerate(together):
        (alone,) = beam_search(paced, features[i : i + 1], beam=3, max_length=14, rules=RULES, n_best=3)
        assert [b.tokens for b in alone.beams] == [b.tokens for b in generation.beams]
        assert [b.log_prob for b in alone.beams] == pytest.approx([b.log_prob for b in generation.beams], abs=1e-5)
        torch.testing.assert_close(alone.attention["alpha"], generation.attention["alpha"])


@pytest.mark.parametrize("kind", ["soft", "hard", "marginal", "transformer"])
def test_beam_search_keeps_one_fixed_state_per_image_and_matches_one_per_hypothesis(kind):
    if kind == "transformer":
        torch.manual_seed(0)
        decoder = TransformerDecoder(TransformerDecoderConfig(vocab_size=30, region_dim=16, grid=(3, 4), d_model=16,
                                                              num_layers=2, num_heads=4, ffn_dim=32, dropout=0.0))
    else:
        decoder = make_decoder(attention_mode=kind)
    decoder.eval()
    assert set(decoder.fixed_state) & set(decoder.init_state(torch.randn(1, 12, 16)))
    fixed_addresses = []

    def step(tokens, state):
        fixed_addresses.append((tokens.shape[0], {name: state[name].data_ptr() for name in decoder.fixed_state
                                                  if name in state}))
        assert all(state[name].shape[0] * 3 == tokens.shape[0] for name in decoder.fixed_state if name in state)
        return decoder.step(tokens, state)                                                   # one row per image

    features = torch.randn(4, 12, 16)
    watched = SimpleNamespace(init_state=decoder.init_state, step=step, fixed_state=decoder.fixed_state)
    reorders_all = SimpleNamespace(init_state=decoder.init_state, step=decoder.step)   # no fixed_state
    kept = beam_search(watched, features, beam=3, max_length=10, rules=RULES)
    reordered = beam_search(reorders_all, features, beam=3, max_length=10, rules=RULES)
    assert len(fixed_addresses) > 2       # never copied, except when finished images leave the search
    assert all(a == b for (rows_a, a), (rows_b, b) in zip(fixed_addresses, fixed_addresses[1:]) if rows_a == rows_b)
    for a, b in zip(kept, reordered):   # one row of regions per image, or one per hypothesis: the same search
        assert a.tokens == b.tokens and a.log_prob == pytest.approx(b.log_prob, abs=1e-5)
        for name in a.attention:
            torch.testing.assert_close(a.attention[name], b.attention[name], rtol=1e-5, atol=1e-6)


def test_beam_finds_at_least_greedy_probability_and_attention_per_word():
    decoder = make_decoder().eval()
    features = torch.randn(8, 12, 16)
    g = greedy(decoder, features, max_length=10, rules=RULES)
    b = beam_search(decoder, features, beam=4, max_length=10, rules=RULES)
    for x, y in zip(g, b):
        if END in x.tokens or len(x.tokens) < 10:  # greedy finished: beam's best can only be as good or better
            assert y.log_prob >= x.log_prob - 1e-5
        torch.testing.assert_close(y.attention["alpha"].sum(-1), torch.ones(len(y.tokens)))


def test_decoder_memorises_a_few_captions():
    decoder = make_decoder(dropout=0.0)
    torch.manual_seed(1)
    features = torch.randn(4, 12, 16)
    captions = torch.tensor([[START, 5, 6, 7, END], [START, 8, 9, END, 0], [START, 10, 11, 12, END], [START, 7, 6, 5, END]])
    assert memorise(decoder, features, captions, lr=1e-2) < 0.05
    decoded = greedy(decoder.eval(), features, max_length=6, rules=RULES)
    assert [g.tokens for g in decoded] == [[5, 6, 7], [8, 9], [10, 11, 12], [7, 6, 5]]


def plain_additive_scores(keys, query, weight, bias):
    """The additive score by torch's own autograd: the reference for the one-node version."""
    return torch.nn.functional.linear(torch.tanh(keys.unsqueeze(1) + query.unsqueeze(2)), weight, bias).squeeze(-1)


@pytest.mark.parametrize("keep_graph", [False, True])
def test_the_additive_score_node_has_the_gradients_of_plain_autograd(keep_graph):
    from captioner.models.attention import additive_tanh_scores

    torch.manual_seed(0)
    inputs = [torch.randn(3, 7, 5, dtype=torch.float64), torch.randn(3, 2, 5, dtype=torch.float64),
              torch.randn(1, 5, dtype=torch.float64), torch.randn(1, dtype=torch.float64)]
    upstream = torch.randn(3, 2, 7, dtype=torch.float64)

    def gradients(score):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = score(*leaves)
        grads = torch.autograd.grad(out, leaves, upstream, retain_graph=keep_graph)
        if keep_graph:     # a kept graph must give the same gradients again: nothing saved was overwritten
            torch.testing.assert_close(torch.autograd.grad(out, leaves, upstream), grads)
        return out.detach(), grads

    (node_out, node_grads), (plain_out, plain_grads) = gradients(additive_tanh_scores), gradients(plain_additive_scores)
    torch.testing.assert_close(node_out, plain_out, rtol=1e-12, atol=1e-12)
    for node, plain in zip(node_grads, plain_grads):
        torch.testing.assert_close(node, plain, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("keep_graph", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_word_loss_node_has_the_gradients_of_plain_autograd(smoothing, keep_graph):
    torch.manual_seed(0)
    logits, targets = torch.randn(2, 6, 11), torch.randint(1, 11, (2, 6))     # the loss is float32 whatever the logits
    targets[0, 4:] = 0                                                     # padding
    upstream = torch.tensor(0.7)
    node_logits = logits.clone().requires_grad_()
    loss = caption_loss(node_logits, targets, None, 0.0, label_smoothing=smoothing)["loss"]
    (node,) = torch.autograd.grad(loss, node_logits, upstream, retain_graph=keep_graph)
    if keep_graph:
        torch.testing.assert_close(torch.autograd.grad(loss, node_logits, upstream)[0], node)
    plain_logits = logits.clone().requires_grad_()
    real = targets != 0
    plain_loss = torch.nn.functional.cross_entropy(plain_logits[real], targets[real], label_smoothing=smoothing)
    (plain,) = torch.autograd.grad(plain_loss, plain_logits, upstream)
    torch.testing.assert_close(loss.detach(), plain_loss.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(node, plain, rtol=1e-5, atol=1e-7)
    assert node[~real].eq(0).all()


def parameter_gradients(decoder, loss) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``loss`` (detached) and the gradient it gives each of ``decoder``'s parameters that gets one."""
    decoder.zero_grad()
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in decoder.named_parameters() if p.grad is not None}


def stepwise_loss(decoder, features, captions) -> torch.Tensor:
    """The mean negative log-likelihood of ``captions`` (B, T+1) through the decode-step interface, word by word."""
    targets = captions[:, 1:]
    real = targets != 0
    state, log_probs = decoder.init_state(features), []
    for t in range(targets.shape[1]):
        step_log_probs, state, _ = decoder.step(captions[:, t], state)
        log_probs.append(step_log_probs)
    chosen = torch.stack(log_probs, 1).gather(2, targets.unsqueeze(2)).squeeze(2)
    return -chosen[real].sum() / real.sum()


@pytest.mark.parametrize("kind, options", [("additive", {}), ("additive", {"gate": "vector", "learned_sharpness": True}),
                                           ("dot", {"gate": "none"}), ("general", {}), ("none", {}),
                                           ("additive", {"region_norm": "layer", "region_embed": 8}),
                                           ("additive", {"region_norm": "image"})])
def test_teacher_forcing_has_the_gradients_of_word_by_word_steps(kind, options, monkeypatch):
    """The packed, step-major teacher forcing (one product for the weights' gradients over all words, one node
    for the additive score, one for the loss) against the decode-step interface run word by word under
    torch's own autograd: the same loss and the same gradient for every parameter."""
    from captioner.models import attention

    features, captions = torch.randn(3, 12, 16), captions_batch()
    decoder = make_decoder(kind, region_position="sinusoidal", position_dim=4, **options)
    out = decoder(features, captions)
    packed_loss, packed = parameter_gradients(decoder, caption_loss(out.logits, captions[:, 1:], None, 0.0)["loss"])

    monkeypatch.setattr(attention, "additive_tanh_scores", plain_additive_scores)
    word_by_word_loss, stepwise = parameter_gradients(decoder, stepwise_loss(decoder, features, captions))

    torch.testing.assert_close(packed_loss, word_by_word_loss, rtol=1e-6, atol=1e-6)
    assert packed.keys() == stepwise.keys() and "recurrent_gates.weight" in packed
    for name in packed:
        torch.testing.assert_close(packed[name], stepwise[name], rtol=1e-4, atol=1e-6, msg=name)
