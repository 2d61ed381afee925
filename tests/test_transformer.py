"""The Transformer decoder: masks, the key/value cache, the searches that drive it, and a memorisation run."""

from functools import partial
from types import SimpleNamespace

import pytest
import torch

from captioner.decoding.search import TokenRules, beam_search, greedy, select_state
from captioner.errors import CaptionerError
from captioner.models.transformer_decoder import (
    Packing,
    TransformerDecoder,
    TransformerDecoderConfig,
)
from tests.conftest import memorise, padded_logits

START, END = 1, 2
RULES = TokenRules(START, END)
VOCAB, DIM, GRID = 30, 12, (2, 3)


def make_decoder(dropout: float = 0.0, **kw) -> TransformerDecoder:
    torch.manual_seed(0)
    options = dict(d_model=16, num_layers=2, num_heads=4, ffn_dim=32, max_length=16) | kw
    return TransformerDecoder(TransformerDecoderConfig(vocab_size=VOCAB, region_dim=DIM, grid=GRID, dropout=dropout, **options)).eval()


def without_cache(decoder: TransformerDecoder) -> SimpleNamespace:
    """The same decoder seen by a search that re-runs the whole prefix at every step."""
    return SimpleNamespace(init_state=partial(decoder.init_state, use_cache=False), step=decoder.step)


def captions_with_lengths(lengths: list[int], generator: torch.Generator) -> torch.Tensor:
    """``<start> w.. <end> <pad>..`` (B, max+2) with the given numbers of words."""
    captions = torch.zeros(len(lengths), max(lengths) + 2, dtype=torch.long)
    for row, n in enumerate(lengths):
        captions[row, 0] = START
        captions[row, 1 : n + 1] = torch.randint(4, VOCAB, (n,), generator=generator)
        captions[row, n + 1] = END
    return captions


def assert_same_generation(a, b) -> None:
    """Two decodings of one image agree: words, log-probability (1e-4) and attention maps (1e-5)."""
    assert a.tokens == b.tokens
    assert a.log_prob == pytest.approx(b.log_prob, abs=1e-4)
    torch.testing.assert_close(a.attention["alpha"], b.attention["alpha"], rtol=1e-5, atol=1e-5)


def test_causal_mask_does_not_leak():
    decoder = make_decoder()
    features = torch.randn(2, 6, DIM)
    captions = captions_with_lengths([6, 6], torch.Generator().manual_seed(0))
    changed = captions.clone()
    changed[:, 4] = torch.tensor([5, 7])
    with torch.no_grad():
        mask = captions[:, 1:] != 0
        before, after = (padded_logits(decoder(features, c), mask) for c in (captions, changed))
    torch.testing.assert_close(after[:, :4], before[:, :4], rtol=0, atol=0)
    assert not torch.allclose(after[:, 4], before[:, 4])


def test_padding_does_not_change_real_positions():
    decoder = make_decoder()
    features = torch.randn(3, 6, DIM)
    lengths = [2, 5, 3]
    captions = captions_with_lengths(lengths, torch.Generator().manual_seed(1))
    with torch.no_grad():
        padded = decoder(features, captions)
        extended = torch.cat([captions, torch.zeros(3, 4, dtype=torch.long)], dim=1)
        more_padding = decoder(features, extended)
        noise = captions.clone()
        noise[noise == 0] = torch.randint(4, VOCAB, (int((noise == 0).sum()),))
        noisy = decoder(features, noise)
        for row, n in enumerate(lengths):
            alone = decoder(features[row : row + 1], captions[row : row + 1, : n + 2])
            for out, shown in ((padded, captions), (more_padding, extended), (noisy, noise)):
                logits = padded_logits(out, shown[:, 1:] != 0)
                torch.testing.assert_close(logits[row, : n + 1], alone.logits, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(out.alpha[row, : n + 1], alone.alpha[0], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(padded.logits).all()


@pytest.mark.parametrize("options", [{}, {"region_position": "sinusoidal", "attention_layer": 0, "tie_embeddings": False},
                                     {"num_layers": 3, "attention_layer": 1}, {"num_layers": 3, "attention_map": "mean"}])
@pytest.mark.parametrize("use_cache", [True, False])
def test_incremental_decoding_equals_forward(options, use_cache):
    decoder = make_decoder(**options)
    features = torch.randn(4, 6, DIM)
    captions = captions_with_lengths([7, 7, 7, 7], torch.Generator().manual_seed(2))
    order = torch.tensor([2, 0, 3, 1])
    with torch.no_grad():
        out = decoder(features, captions)
        expected_log_probs = padded_logits(out, captions[:, 1:] != 0).log_softmax(-1)
        state = decoder.init_state(features, use_cache=use_cache)
        rows = torch.arange(4)
        for t in range(captions.shape[1] - 1):
            if t == 3:  # a search reorders hypotheses: every state tensor must follow the batch
                state, rows = select_state(state, order), rows[order]
            log_probs, state, attention = decoder.step(captions[rows, t], state)
            assert log_probs.dtype == torch.float32 and log_probs.shape == (4, VOCAB)
            torch.testing.assert_close(log_probs, expected_log_probs[rows, t], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(attention["alpha"], out.alpha[rows, t], rtol=1e-5, atol=1e-5)
    assert all(value.shape[0] == 4 for value in state.values())


def test_searches_with_and_without_cache_agree():
    decoder = make_decoder()
    features = torch.randn(3, 6, DIM)
    for search in (partial(greedy), partial(beam_search, beam=3)):
        cached = search(decoder, features, max_length=8, rules=RULES)
        uncached = search(without_cache(decoder), features, max_length=8, rules=RULES)
        for a, b in zip(cached, uncached):
            assert_same_generation(a, b)


def test_beam_of_one_is_greedy_and_batch_equals_single_images():
    decoder = make_decoder()
    features = torch.randn(4, 6, DIM)
    kw = dict(max_length=8, rules=RULES)
    greedy_out = greedy(decoder, features, **kw)
    for a, b in zip(greedy_out, beam_search(decoder, features, beam=1, **kw)):
        assert a.tokens == b.tokens and a.log_prob == pytest.approx(b.log_prob, abs=1e-5)
    batched = beam_search(decoder, features, beam=3, **kw)
    for row, hypothesis in enumerate(batched):
        assert_same_generation(hypothesis, beam_search(decoder, features[row : row + 1], beam=3, **kw)[0])


def test_packed_teacher_forcing_equals_the_padded_pass_at_every_real_position():
    """The real positions alone, packed through the position-wise parts (what training runs), give the states and
    the cross-attention that the padded pass with its pad-key mask (what decoding without the cache runs) gives
    there; the gradients of a loss over them agree too."""
    decoder = make_decoder(num_layers=3, attention_map="mean")
    features = torch.randn(3, 6, DIM)
    captions = captions_with_lengths([2, 7, 4], torch.Generator().manual_seed(5))
    tokens, real = captions[:, :-1], captions[:, 1:] != 0
    memory_kv = decoder.memory_kv(decoder.prepare_regions(features))
    packed, packed_weights = decoder.run_layers(tokens, memory_kv, Packing(real))
    padded, padded_weights = decoder.run_layers(tokens, memory_kv)
    assert packed.shape == (int(real.sum()), 16) and int(real.sum()) < real.numel()
    torch.testing.assert_close(packed, padded[real], rtol=1e-5, atol=1e-5)
    by_position = [w.transpose(1, 2) for w in (packed_weights, padded_weights)]      # (B, T, heads, L)
    torch.testing.assert_close(by_position[0][real], by_position[1][real])
    assert (by_position[0][~real] == 0).all()
    gradients = []
    for states in (packed, padded[real]):
        decoder.zero_grad()
        decoder.out_words(states).logsumexp(-1).sum().backward(retain_graph=True)
        gradients.append({name: p.grad.clone() for name, p in decoder.named_parameters() if p.grad is not None})
    assert gradients[0].keys() == gradients[1].keys()
    for name in gradients[0]:
        torch.testing.assert_close(gradients[0][name], gradients[1][name], rtol=1e-4, atol=1e-5, msg=name)


def per_head_maps(decoder, features: torch.Tensor, captions: torch.Tensor) -> torch.Tensor:
    """The reported cross-attention of every head, (B, heads, T, L), of the teacher-forced pass."""
    real = captions[:, 1:] != 0
    memory_kv = decoder.memory_kv(decoder.prepare_regions(features))
    return decoder.run_layers(captions[:, :-1], memory_kv, Packing(real))[1]


def test_alpha_rows_sum_to_one_at_real_steps_zero_at_padding_and_heads_average_to_alpha():
    decoder = make_decoder()
    features = torch.randn(2, 6, DIM)
    captions = captions_with_lengths([3, 5], torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = decoder(features, captions)
        heads = per_head_maps(decoder, features, captions)
        _, _, attention = decoder.step(torch.full((2,), START), decoder.init_state(features))
    assert out.alpha.shape == (2, 6, 6) and heads.shape == (2, 4, 6, 6)
    real = (captions[:, 1:] != 0).float()          # as the decoders' TeacherForced: attention nowhere at padding
    assert real.sum() == 3 + 1 + 5 + 1 and (real == 0).any()
    torch.testing.assert_close(out.alpha.sum(-1), real)
    torch.testing.assert_close(heads.sum(-1), real[:, None].expand(2, 4, 6))
    torch.testing.assert_close(heads.mean(1), out.alpha)
    torch.testing.assert_close(attention["alpha"].sum(-1), torch.ones(2))


def test_the_mean_attention_map_is_the_mean_of_every_layers_map():
    per_layer = [make_decoder(num_layers=3, attention_layer=i) for i in range(3)]
    mean = make_decoder(num_layers=3, attention_map="mean")
    for decoder in per_layer:
        decoder.load_state_dict(mean.state_dict())
    features = torch.randn(2, 6, DIM)
    captions = captions_with_lengths([3, 5], torch.Generator().manual_seed(3))
    with torch.no_grad():
        maps = [decoder(features, captions) for decoder in per_layer]
        out = mean(features, captions)
        heads = [per_head_maps(decoder, features, captions) for decoder in (*per_layer, mean)]
    assert not torch.allclose(maps[0].alpha, maps[2].alpha)               # the layers do differ
    torch.testing.assert_close(out.alpha, torch.stack([m.alpha for m in maps]).mean(0))
    torch.testing.assert_close(heads[-1], torch.stack(heads[:-1]).mean(0))
    torch.testing.assert_close(out.logits, maps[0].logits)                 # what is reported changes no word
    torch.testing.assert_close(out.alpha.sum(-1), (captions[:, 1:] != 0).float())


def test_memorises_four_captions_and_greedy_reproduces_them():
    decoder = make_decoder(d_model=32, ffn_dim=64).train()
    generator = torch.Generator().manual_seed(4)
    features = torch.randn(4, 6, DIM, generator=generator)
    captions = captions_with_lengths([3, 4, 2, 4], generator)
    assert memorise(decoder, features, captions, lr=3e-3) < 0.02
    decoder.eval()
    generated = greedy(decoder, features, max_length=8, rules=RULES)
    assert [g.tokens for g in generated] == [row[1 : row.tolist().index(END)].tolist() for row in captions]


def test_tied_embeddings_share_the_tensor():
    tied, untied = make_decoder(tie_embeddings=True), make_decoder(tie_embeddings=False)
    assert tied.out_words.weight is tied.embedding.weight
    assert untied.out_words.weight is not untied.embedding.weight
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == VOCAB * 16
    restored = make_decoder(tie_embeddings=True)
    restored.load_state_dict(tied.state_dict())
    assert restored.out_words.weight is restored.embedding.weight


def test_dropout_only_in_training():
    decoder = make_decoder(dropout=0.3)
    features = torch.randn(2, 6, DIM)
    captions = captions_with_lengths([4, 4], torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(decoder(features, captions).logits, decoder(features, captions).logits, rtol=0, atol=0)
        decoder.train()
        assert not torch.equal(decoder(features, captions).logits, decoder(features, captions).logits)


def test_rejects_bad_configs_and_too_long_inputs():
    with pytest.raises(ValueError, match="num_heads"):
        make_decoder(d_model=18)
    with pytest.raises(CaptionerError, match="model.transformer.region_position must be learned, sinusoidal or none"):
        make_decoder(region_position="random")
    with pytest.raises(ValueError, match="attention_layer"):
        make_decoder(attention_layer=2)
    decoder = make_decoder(max_length=4)
    with pytest.raises(ValueError, match="max_length"):
        decoder(torch.randn(1, 6, DIM), torch.ones(1, 6, dtype=torch.long))
    state = decoder.init_state(torch.randn(1, 6, DIM))
    for _ in range(4):
        _, state, _ = decoder.step(torch.tensor([START]), state)
    with pytest.raises(ValueError, match="max_length"):
        decoder.step(torch.tensor([START]), state)


def test_mean_memory_ablation_reads_the_mean_of_the_regions_and_reports_no_attention():
    """memory: mean (the no-attention ablation): the words depend on the regions only through their mean (any
    permutation of the regions gives the same logits, unlike memory: regions), no map is reported, and the
    cached step equals teacher forcing."""
    ablation, attending = make_decoder(memory="mean"), make_decoder()     # learned region positions: order matters
    features = torch.randn(3, 6, DIM)
    shuffled = features[:, torch.tensor([5, 3, 1, 0, 2, 4])]
    captions = captions_with_lengths([5, 3, 4], torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = ablation(features, captions)
        assert out.alpha is None
        torch.testing.assert_close(ablation(shuffled, captions).logits, out.logits)
        assert (attending(shuffled, captions).logits - attending(features, captions).logits).abs().max() > 1e-3
    for generation, one_by_one in zip(greedy(ablation, features, max_length=8, rules=RULES),
                                      [greedy(ablation, features[i:i + 1], max_length=8, rules=RULES)[0] for i in range(3)]):
        assert generation.attention == {} and generation.tokens == one_by_one.tokens
