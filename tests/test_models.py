"""Attention, the soft-attention LSTM decoder, its loss, and the searches that decode it."""

import pytest
import torch

from captioner.decoding.search import beam_search, greedy, sample
from captioner.models.attention import SCORES, RegionAttention
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig, sinusoidal_grid_code
from captioner.training.losses import caption_loss
from tests.conftest import memorise

START, END = 1, 2


def make_decoder(attention="additive", vocab=30, dim=16, grid=(3, 4), dropout=0.0, **kw) -> LSTMDecoder:
    torch.manual_seed(0)
    config = LSTMDecoderConfig(vocab_size=vocab, region_dim=dim, grid=grid, attention=attention, attention_dim=12,
                               embed_dim=10, hidden_dim=14, dropout=dropout, **kw)
    return LSTMDecoder(config)


@pytest.mark.parametrize("score", SCORES)
def test_attention_sums_to_one_and_masked_regions_get_zero(score):
    torch.manual_seed(0)
    attention = RegionAttention(score, region_dim=6, query_dim=5, attention_dim=4)
    regions, query = torch.randn(3, 7, 6), torch.randn(3, 5)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[0, 4:] = False
    mask[2, 0] = False
    alpha = attention(attention.project_regions(regions), query, 7, mask)
    assert alpha.shape == (3, 7)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(3))
    assert alpha[~mask].eq(0).all()
    if score == "none":
        torch.testing.assert_close(alpha[1], torch.full((7,), 1 / 7))


def test_additive_score_matches_formula():
    torch.manual_seed(0)
    attention = RegionAttention("additive", 6, 5, 4)
    regions, query = torch.randn(2, 3, 6), torch.randn(2, 5)
    expected = attention.energy(torch.tanh(attention.region_proj(regions) + attention.query_proj(query)[:, None]))[..., 0]
    torch.testing.assert_close(attention(attention.project_regions(regions), query, 3), expected.softmax(-1))


def test_position_code_distinct_per_cell():
    code = sinusoidal_grid_code((3, 5), 16)
    assert code.shape == (15, 16)
    assert torch.cdist(code, code).add(torch.eye(15)).min() > 1e-3


def captions_batch():
    captions = torch.tensor([[START, 5, 6, 7, END, 0, 0], [START, 8, END, 0, 0, 0, 0], [START, 5, 5, 5, 5, 5, END]])
    return captions


def test_forward_shapes_and_alpha_rows_sum_to_one():
    decoder = make_decoder(region_position="sinusoidal", position_dim=8).eval()
    out = decoder(torch.randn(3, 12, 16), captions_batch())
    assert out["logits"].shape == (3, 6, 30) and out["alpha"].shape == (3, 6, 12)
    torch.testing.assert_close(out["alpha"].sum(-1), torch.ones(3, 6))


def test_loss_ignores_padding():
    decoder = make_decoder().eval()
    features, captions = torch.randn(3, 12, 16), captions_batch()
    other = captions.clone()
    other[captions == 0] = 9  # change only padded positions (after <end>)
    def loss_of(c):
        out = decoder(features, c)
        return caption_loss(out["logits"], captions[:, 1:], out["alpha"], 1.0)
    a, b = loss_of(captions), loss_of(other)
    torch.testing.assert_close(a["loss"], b["loss"])
    assert int(a["words"]) == 4 + 2 + 6


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
    g = greedy(decoder, features, max_length=12, start_index=START, end_index=END)
    b = beam_search(decoder, features, beam_size=1, max_length=12, start_index=START, end_index=END)
    for x, y in zip(g, b):
        assert x.tokens == y.tokens
        assert x.log_prob == pytest.approx(y.log_prob, abs=1e-5)
        torch.testing.assert_close(x.attention["alpha"], y.attention["alpha"])


def test_batched_beam_equals_one_at_a_time():
    decoder = make_decoder().eval()
    features = torch.randn(5, 12, 16)
    together = beam_search(decoder, features, beam_size=3, max_length=10, start_index=START, end_index=END)
    for i in range(5):
        (alone,) = beam_search(decoder, features[i : i + 1], beam_size=3, max_length=10, start_index=START, end_index=END)
        assert alone.tokens == together[i].tokens
        assert alone.log_prob == pytest.approx(together[i].log_prob, abs=1e-4)
        assert alone.attention["alpha"].shape == (len(alone.tokens), 12)


def test_beam_finds_at_least_greedy_probability_and_attention_per_word():
    decoder = make_decoder().eval()
    features = torch.randn(8, 12, 16)
    g = greedy(decoder, features, max_length=10, start_index=START, end_index=END)
    b = beam_search(decoder, features, beam_size=4, max_length=10, start_index=START, end_index=END)
    for x, y in zip(g, b):
        if END in x.tokens or len(x.tokens) < 10:  # greedy finished: beam's best can only be as good or better
            assert y.log_prob >= x.log_prob - 1e-5
        torch.testing.assert_close(y.attention["alpha"].sum(-1), torch.ones(len(y.tokens)))


def test_sampling_is_reproducible_with_a_generator():
    decoder = make_decoder().eval()
    features = torch.randn(4, 12, 16)
    runs = [sample(decoder, features, max_length=8, start_index=START, end_index=END, temperature=1.5,
                   generator=torch.Generator().manual_seed(5)) for _ in range(2)]
    assert [g.tokens for g in runs[0]] == [g.tokens for g in runs[1]]


def test_decoder_memorises_a_few_captions():
    decoder = make_decoder(dropout=0.0)
    torch.manual_seed(1)
    features = torch.randn(4, 12, 16)
    captions = torch.tensor([[START, 5, 6, 7, END], [START, 8, 9, END, 0], [START, 10, 11, 12, END], [START, 7, 6, 5, END]])
    assert memorise(decoder, features, captions, lr=1e-2) < 0.05
    decoded = greedy(decoder.eval(), features, max_length=6, start_index=START, end_index=END)
    assert [g.tokens for g in decoded] == [[5, 6, 7], [8, 9], [10, 11, 12], [7, 6, 5]]
