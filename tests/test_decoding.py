"""Decoding options, all in the one search for every decoder: <unk> suppression, n-gram blocking, minimum
length, n-best lists, diverse beam search, seeded sampling (temperature, top-k, nucleus), ensembles, and the
diversity measures that show their effect."""

import json
from dataclasses import replace

import pytest
import torch

from captioner.data.vocabulary import Vocabulary
from captioner.decoding.ensemble import EnsembleDecoder
from captioner.decoding.search import (DecodeConfig, PriorAdjusted, TokenRules, beam_search, decode, greedy,
                                      sample_captions, seeded_uniforms)
from captioner.errors import CaptionerError
from captioner.evaluation.diversity import diversity_measures, unseen_endings
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.models.transformer_decoder import (
    TransformerDecoder,
    TransformerDecoderConfig,
)

VOCAB = Vocabulary(["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(26)])
RULES = TokenRules(VOCAB.start_index, VOCAB.end_index)


def lstm(seed: int = 0, **kw) -> LSTMDecoder:
    torch.manual_seed(seed)
    options = dict(vocab_size=len(VOCAB), region_dim=16, grid=(3, 4), attention_dim=12, embed_dim=10, hidden_dim=14,
                   dropout=0.0) | kw
    return LSTMDecoder(LSTMDecoderConfig(**options)).eval()


def transformer(seed: int = 0) -> TransformerDecoder:
    torch.manual_seed(seed)
    return TransformerDecoder(TransformerDecoderConfig(vocab_size=len(VOCAB), region_dim=16, grid=(3, 4), d_model=16,
                                                       num_layers=1, num_heads=2, ffn_dim=32, dropout=0.0)).eval()


def fond_of(decoder, word: int, bonus: float = 20.0):
    """The decoder with its output layer tilted towards ``word``."""
    with torch.no_grad():
        decoder.out_words.bias[word] += bonus
    return decoder


def features(n: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 12, 16, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("decode_config", [DecodeConfig(beam=1), DecodeConfig(beam=3), DecodeConfig(method="sample"),
                                      DecodeConfig(beam=4, beam_groups=2)], ids=["greedy", "beam", "sample", "diverse"])
@pytest.mark.parametrize("make", [lstm, transformer], ids=["lstm", "transformer"])
def test_unk_is_never_emitted_when_suppressed(make, decode_config):
    decoder = fond_of(make(), VOCAB.unk_index)
    loud = decode(decoder, features(), VOCAB, replace(decode_config, suppress_unk=False))
    assert any(VOCAB.unk_index in g.tokens for g in loud)           # the model wants <unk> ...
    for generation in decode(decoder, features(), VOCAB, decode_config):   # ... and never gets it
        assert VOCAB.unk_index not in generation.tokens
        assert VOCAB.start_index not in generation.tokens and VOCAB.pad_index not in generation.tokens


def test_token_rules_by_hand():
    log_probs = torch.zeros(2, 8)
    words = torch.tensor([[4, 5, 6, 4, 5], [4, 4, 7, 7, 4]])

    def banned(rules, row):
        return torch.isinf(rules.apply(log_probs, words)[row]).nonzero().flatten().tolist()

    assert banned(TokenRules(1, 2, block_ngram=3), 0) == [0, 1, 6]     # "4 5 6" came before: no 6 after "4 5"
    assert banned(TokenRules(1, 2, block_ngram=3), 1) == [0, 1]        # no trigram so far starts with "7 4"
    assert banned(TokenRules(1, 2, block_ngram=2), 0) == [0, 1, 6]     # after "5": not "6" again
    assert banned(TokenRules(1, 2, block_ngram=2), 1) == [0, 1, 4, 7]  # after "4": "4 4" and "4 7" were used
    once = TokenRules(1, 2, block_ngram=1, unk_index=3, min_length=6)  # no word twice, no <unk>, no <end> yet
    assert banned(once, 0) == [0, 1, 2, 3, 4, 5, 6]
    assert banned(TokenRules(1, 2), 0) == [0, 1]                       # <start> and <pad>, always
    assert banned(TokenRules(1, 2, open_words=(5, 6)), 0) == [0, 1, 2]  # no <end> right after "5"
    assert banned(TokenRules(1, 2, open_words=(5, 6)), 1) == [0, 1]     # after "4" it may end


def test_block_ngram_and_min_length_hold_in_every_search():
    decoder = fond_of(lstm(), VOCAB.index["w1"], 6.0)
    for decode_config in (DecodeConfig(beam=1, block_ngram=2), DecodeConfig(beam=3, block_ngram=2),
                     DecodeConfig(method="sample", block_ngram=2, temperature=2.0)):
        looping = decode(decoder, features(), VOCAB, replace(decode_config, block_ngram=0, max_length=12))
        assert any(len(set(zip(g.tokens, g.tokens[1:]))) < len(g.tokens) - 1 for g in looping)
        for g in decode(decoder, features(), VOCAB, replace(decode_config, max_length=12)):
            bigrams = list(zip(g.tokens, g.tokens[1:]))
            assert len(bigrams) == len(set(bigrams))
    early = fond_of(lstm(), VOCAB.end_index)
    assert all(g.tokens == [] for g in decode(early, features(), VOCAB, DecodeConfig(beam=3)))
    assert all(len(g.tokens) >= 4 for g in decode(early, features(), VOCAB, DecodeConfig(beam=3, min_length=4)))


@pytest.mark.parametrize("decode_config", [DecodeConfig(beam=1), DecodeConfig(beam=3), DecodeConfig(method="sample")],
                         ids=["greedy", "beam", "sample"])
def test_no_dangling_end_keeps_end_from_following_an_open_word(decode_config):
    words = Vocabulary([*VOCAB.words[:4], "the", *VOCAB.words[5:]])           # "the" in place of w0
    decoder = fond_of(fond_of(lstm(), words.index["the"], 12.0), words.end_index, 12.0)
    decode_config = replace(decode_config, min_length=1, max_length=6, block_ngram=1)      # "the" once, then <end>
    assert all(g.tokens[-1:] == [words.index["the"]] for g in decode(decoder, features(), words, decode_config))
    guarded = decode(decoder, features(), words, replace(decode_config, no_dangling_end=True))
    assert all(g.tokens and g.tokens[-1] != words.index["the"] or len(g.tokens) == 6 for g in guarded)
    assert all(len(g.tokens) < 6 for g in guarded)                  # it still ends, on another word


def test_may_end_by_hand():
    vocab = Vocabulary.build(["a dog on a dirt road", "dogs play in the dirt", "a red bed"], min_count=1)
    assert vocab.endings == sorted((vocab.index[a], vocab.index[b]) for a, b in
                                   (("dirt", "road"), ("the", "dirt"), ("red", "bed")))
    ending = {"on a dirt": False, "a red dirt": True, "in the dirt": True, "a dirt road": True, "on a road": False,
              "a dog bed": True, "dogs play": False, "dirt": False, "a": False}
    for caption, expected in ending.items():
        words = torch.tensor([[vocab.index[w] for w in caption.split()]])
        assert bool(vocab.may_end(words)[0]) is expected, caption
    assert not vocab.may_end(torch.empty(2, 0, dtype=torch.long)).any()          # no empty caption
    assert unseen_endings(dict(enumerate(ending)), vocab) == pytest.approx(5 / 9)
    with pytest.raises(CaptionerError, match="without its training captions' endings"):
        Vocabulary(vocab.words).may_end(torch.ones(1, 2, dtype=torch.long))


@pytest.mark.parametrize("decode_config", [DecodeConfig(beam=1), DecodeConfig(beam=3), DecodeConfig(method="sample")],
                         ids=["greedy", "beam", "sample"])
@pytest.mark.parametrize("make", [lstm, transformer], ids=["lstm", "transformer"])
def test_seen_endings_stop_captions_only_where_training_captions_stop(make, decode_config):
    words = [*VOCAB.words[:4], "a", "dirt", "road", "the", *VOCAB.words[8:]]       # "a dirt road", "in the dirt"
    index = {word: i for i, word in enumerate(words)}
    vocab = Vocabulary(words, endings=[(index["dirt"], index["road"]), (index["the"], index["dirt"])])
    decoder = fond_of(fond_of(fond_of(make(), index["dirt"], 12.0), vocab.end_index, 12.0), index["road"], 6.0)
    decode_config = replace(decode_config, max_length=6, block_ngram=1)     # "dirt" once, then <end> (or "road")
    plain = decode(decoder, features(), vocab, decode_config)
    assert any(len(g.tokens) < 6 and not vocab.may_end(torch.tensor([g.tokens]))[0] for g in plain)
    guarded = decode(decoder, features(), vocab, replace(decode_config, seen_endings=True))
    assert all(len(g.tokens) == 6 or vocab.may_end(torch.tensor([g.tokens]))[0] for g in guarded)
    assert any(len(g.tokens) < 6 for g in guarded)                   # it still ends, where captions end
    with pytest.raises(CaptionerError, match="decode.seen_endings: this vocabulary was saved without"):
        decode(decoder, features(), Vocabulary(words), replace(decode_config, seen_endings=True))


def test_scores_saved_before_a_decode_setting_existed_are_reused_by_report(tmp_path):
    from dataclasses import asdict

    from captioner.checkpoint import checkpoint_digest
    from captioner.workflows.report import _stored_scores

    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(b"weights")
    config = DecodeConfig(beam=3, block_ngram=2)
    saved = {k: v for k, v in asdict(config).items() if k != "seen_endings"}    # written before it existed
    scores = {"overrides": [], "decode": saved, "checkpoint_sha256": [checkpoint_digest(checkpoint)], "CIDEr": 0.5}
    (tmp_path / "scores_val.json").write_text(json.dumps(scores))
    assert config.same_as(saved) and not replace(config, seen_endings=True).same_as(saved)
    assert not replace(config, block_ngram=3).same_as(saved)
    assert _stored_scores(tmp_path / "scores_val.json", checkpoint, config) == scores
    assert _stored_scores(tmp_path / "scores_val.json", checkpoint, replace(config, seen_endings=True)) is None


def test_n_best_beams_are_sorted_distinct_and_scored_by_the_decoder():
    decoder = lstm()
    found = beam_search(decoder, features(3), beam=5, max_length=6, rules=RULES, n_best=4)
    for generation in found:
        beams = generation.beams
        assert len(beams) == 4 and beams[0].tokens == generation.tokens
        assert [b.log_prob for b in beams] == sorted((b.log_prob for b in beams), reverse=True)
        assert len({tuple(b.tokens) for b in beams}) == 4
    image = features(3)[:1]
    for beam in found[0].beams:                        # each score is the decoder's own log-probability
        torch.set_grad_enabled(False)
        state, total, token = decoder.init_state(image), 0.0, torch.tensor([VOCAB.start_index])
        for word in beam.tokens + ([VOCAB.end_index] if len(beam.tokens) < 6 else []):
            log_probs, state, _ = decoder.step(token, state)
            total += float(RULES.apply(log_probs, torch.empty(1, 0, dtype=torch.long))[0, word])
            token = torch.tensor([word])
        assert total == pytest.approx(beam.log_prob, abs=1e-4)
    torch.set_grad_enabled(True)
    assert all(g.beams == [] for g in beam_search(decoder, features(3), beam=3, max_length=6, rules=RULES))


def test_diverse_beam_search_reduces_to_plain_beam_search_and_diversifies():
    decoder = lstm()
    plain = beam_search(decoder, features(), beam=3, max_length=8, rules=RULES)
    one_group = beam_search(decoder, features(), beam=3, max_length=8, rules=RULES, groups=1, diversity=5.0)
    for a, b in zip(plain, one_group):                  # one group: the plain search, bit for bit
        assert a.tokens == b.tokens and a.log_prob == b.log_prob
        torch.testing.assert_close(a.attention["alpha"], b.attention["alpha"], rtol=0, atol=0)
    # without the penalty, the groups are three copies of a beam-2 search
    copies = beam_search(decoder, features(), beam=6, max_length=8, rules=RULES, groups=3, diversity=0.0, n_best=6)
    small = beam_search(decoder, features(), beam=2, max_length=8, rules=RULES, n_best=2)
    for a, b in zip(copies, small):
        assert [x.tokens for x in a.beams[::3]] == [x.tokens for x in b.beams]
        assert [x.tokens for x in a.beams] == [x.tokens for x in b.beams for _ in range(3)]
    # with it, the groups' first words differ
    diverse = beam_search(decoder, features(), beam=3, max_length=8, rules=RULES, groups=3, diversity=100.0, n_best=3)
    for generation in diverse:
        firsts = [b.tokens[0] for b in generation.beams if b.tokens]
        assert len(set(firsts)) == len(firsts)


def test_seeded_sampling_is_the_same_batched_one_by_one_and_k_at_once():
    decoder = lstm()
    decode_config = DecodeConfig(method="sample", temperature=1.5, seed=7)
    regions = features(4)
    batched = decode(decoder, regions, VOCAB, decode_config, images=[10, 11, 12, 13])
    for i in range(4):
        (alone,) = decode(decoder, regions[i : i + 1], VOCAB, decode_config, images=[10 + i])
        assert alone.tokens == batched[i].tokens and alone.log_prob == pytest.approx(batched[i].log_prob, abs=1e-5)
    other_seed = decode(decoder, regions, VOCAB, replace(decode_config, seed=8), images=[10, 11, 12, 13])
    assert [g.tokens for g in other_seed] != [g.tokens for g in batched]
    together = sample_captions(decoder, regions, rules=RULES, max_length=8, samples=3,
                               uniforms=seeded_uniforms([5, 6, 7, 8], 3, 8))
    for j in range(3):
        separate = sample_captions(decoder, regions, rules=RULES, max_length=8,
                                   uniforms=seeded_uniforms([5, 6, 7, 8], 1, 8, first_sample=j))
        width = separate.tokens.shape[1]
        torch.testing.assert_close(together.tokens[j::3, :width], separate.tokens)
        assert together.tokens[j::3, width:].eq(VOCAB.pad_index).all()


def marginal(seed: int = 0) -> LSTMDecoder:
    return lstm(seed, attention_mode="marginal", marginal_regions=3, marginal_rest="soft")


@pytest.mark.parametrize("make", [lstm, transformer, marginal], ids=["lstm", "transformer", "marginal"])
def test_sampling_with_gradients_is_the_same_batched_as_image_by_image(make, monkeypatch):
    """An image leaves the batch once all its samples have ended; the words, the log-probabilities, the attention
    and the gradients through them stay those of each image drawn alone."""
    decoder = fond_of(make(), VOCAB.end_index, bonus=2.5)          # captions of many lengths
    regions, seeds, samples, steps = features(6), [3, 4, 5, 6, 7, 8], 3, 10
    weights = torch.randn(6 * samples, steps, generator=torch.Generator().manual_seed(2))

    def draw(rows: slice, index: list[int]):
        drawn = sample_captions(decoder, regions[rows], rules=RULES, max_length=steps, samples=samples,
                                uniforms=seeded_uniforms([seeds[i] for i in index], samples, steps))
        width = drawn.tokens.shape[1]
        loss = (drawn.log_probs * weights[rows.start * samples: rows.stop * samples, :width]).sum()
        return drawn, torch.autograd.grad(loss, list(decoder.parameters()), allow_unused=True)

    rows_per_step = []
    step = decoder.step

    def counted_step(tokens, state):
        rows_per_step.append(len(tokens))
        return step(tokens, state)

    monkeypatch.setattr(decoder, "step", counted_step)
    together, together_grads = draw(slice(0, 6), list(range(6)))
    monkeypatch.undo()
    lengths = together.mask.sum(dim=1).view(6, samples).max(dim=1).values
    assert rows_per_step == [samples * int((lengths > t).sum()) for t in range(len(rows_per_step))]
    assert len(set(rows_per_step)) >= 3 and lengths[:-1].min() < lengths[-1]  # images left, in several steps
    alone_grads = None
    for i in range(6):
        alone, grads = draw(slice(i, i + 1), [i])
        width, rows = alone.tokens.shape[1], slice(i * samples, (i + 1) * samples)
        assert width == lengths[i]
        torch.testing.assert_close(together.tokens[rows, :width], alone.tokens)
        assert together.tokens[rows, width:].eq(VOCAB.pad_index).all() and not together.mask[rows, width:].any()
        for name in ("mask", "log_probs", "model_log_probs", "entropy"):
            torch.testing.assert_close(getattr(together, name)[rows, :width], getattr(alone, name))
            assert not getattr(together, name)[rows, width:].any()
        torch.testing.assert_close(together.attention["alpha"][rows, :width], alone.attention["alpha"])
        assert not together.attention["alpha"][rows, width:].any()
        alone_grads = grads if alone_grads is None else [
            a if b is None else b if a is None else a + b for a, b in zip(alone_grads, grads)]
    for a, b in zip(together_grads, alone_grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_top_k_one_and_a_tiny_nucleus_are_greedy_and_temperature_spreads():
    decoder = lstm()
    regions = features(6)
    best = [g.tokens for g in greedy(decoder, regions, max_length=8, rules=RULES)]
    for decode_config in (DecodeConfig(method="sample", top_k=1), DecodeConfig(method="sample", top_p=1e-6)):
        assert [g.tokens for g in decode(decoder, regions, VOCAB, replace(decode_config, max_length=8))] == best
    hot = decode(decoder, regions, VOCAB, DecodeConfig(method="sample", temperature=5.0, max_length=8))
    assert [g.tokens for g in hot] != best


@pytest.mark.parametrize("decode_config", [DecodeConfig(beam=1), DecodeConfig(beam=3, n_best=2), DecodeConfig(method="sample")])
def test_an_ensemble_of_a_model_with_itself_is_the_model(decode_config):
    for make in (lstm, transformer):
        decoder = make()
        alone = decode(decoder, features(), VOCAB, decode_config)
        doubled = decode(EnsembleDecoder([decoder, decoder]), features(), VOCAB, decode_config)
        for a, b in zip(alone, doubled):
            assert a.tokens == b.tokens and a.log_prob == pytest.approx(b.log_prob, abs=1e-4)
            torch.testing.assert_close(a.attention["alpha"], b.attention["alpha"])


def test_a_mixed_ensemble_averages_probabilities():
    soft, other = lstm(0), transformer(1)
    ensemble = EnsembleDecoder([soft, other])
    state = ensemble.init_state(features(2))
    assert {"0.regions", "0.keys", "1.cross_k0", "1.cross_v0"} <= set(ensemble.fixed_state) & set(state)
    tokens = torch.full((2,), VOCAB.start_index)
    mixed, _, attention = ensemble.step(tokens, state)
    a, _, alpha = soft.step(tokens, soft.init_state(features(2)))
    b, _, _ = other.step(tokens, other.init_state(features(2)))
    torch.testing.assert_close(mixed.exp(), (a.exp() + b.exp()) / 2)
    torch.testing.assert_close(attention["alpha"], alpha["alpha"])            # the first member's maps
    assert len(beam_search(ensemble, features(3), beam=2, max_length=5, rules=RULES)) == 3


def counted(counts: list[int]) -> Vocabulary:
    return Vocabulary(VOCAB.words, [0, 0] + counts + [1] * (len(VOCAB) - 2 - len(counts)))


@pytest.mark.parametrize("decode_config", [DecodeConfig(beam=1), DecodeConfig(beam=3), DecodeConfig(method="sample")],
                         ids=["greedy", "beam", "sample"])
def test_logit_adjustment_divides_by_the_training_prior(decode_config):
    decoder, image = fond_of(lstm(), 4, bonus=4.0), features(4)
    plain = decode(decoder, image, counted([5] * 28), decode_config)
    uniform = decode(decoder, image, counted([5] * 28), replace(decode_config, logit_adjustment=1.0))
    assert [g.tokens for g in uniform] == [g.tokens for g in plain]        # a flat prior changes nothing
    frequent = counted([5, 5, 10**6] + [5] * 25)                        # word 4 seen a million times
    assert sum(g.tokens.count(4) for g in plain) > 0
    adjusted = decode(decoder, image, frequent, replace(decode_config, logit_adjustment=1.0))
    assert sum(g.tokens.count(4) for g in adjusted) == 0
    with pytest.raises(CaptionerError, match="without its training counts"):
        decode(decoder, image, VOCAB, replace(decode_config, logit_adjustment=1.0))


def test_logit_adjustment_is_the_shifted_softmax_by_hand():
    decoder, vocab, tau = lstm(), counted(list(range(1, 29))), 0.7
    adjusted = PriorAdjusted(decoder, vocab.log_prior(), tau, never=(VOCAB.pad_index, VOCAB.start_index))
    torch.set_grad_enabled(False)
    state = decoder.init_state(features(2))
    log_probs, _, _ = decoder.step(torch.tensor([VOCAB.start_index] * 2), state)
    shifted, _, _ = adjusted.step(torch.tensor([VOCAB.start_index] * 2), decoder.init_state(features(2)))
    torch.set_grad_enabled(True)
    by_hand = log_probs.exp() / vocab.log_prior().exp() ** tau
    by_hand[:, [VOCAB.pad_index, VOCAB.start_index]] = 0.0
    assert shifted.exp() == pytest.approx((by_hand / by_hand.sum(dim=1, keepdim=True)), abs=1e-6)


def test_a_checkpoint_saved_without_counts_takes_them_from_its_training_captions(served_checkpoints):
    from captioner.checkpoint import build_checkpoint_model, load_checkpoint

    path = served_checkpoints["soft"]
    payload = load_checkpoint(path)
    assert len(payload["vocab"]["counts"]) == len(payload["vocab"]["words"])    # a run keeps them
    assert payload["vocab"]["endings"]                                           # and its captions' endings
    older = {**payload, "vocab": {"words": payload["vocab"]["words"]}}
    assert build_checkpoint_model(older, path)[1].counts is None
    _, vocab, _ = build_checkpoint_model(older, path, ["decode.logit_adjustment=0.5"])
    assert vocab.counts == payload["vocab"]["counts"]
    _, vocab, _ = build_checkpoint_model(older, path, ["decode.seen_endings=true"])
    assert vocab.to_dict()["endings"] == payload["vocab"]["endings"]
    kept = {**payload, "vocab": {"words": payload["vocab"]["words"], "counts": [7] * len(vocab)}}
    _, vocab, _ = build_checkpoint_model(kept, path, ["decode.seen_endings=true"])     # what it kept stays
    assert vocab.counts == [7] * len(vocab) and vocab.to_dict()["endings"] == payload["vocab"]["endings"]
    for counts in (["many"] * len(vocab), [-1] * len(vocab), [1, 2], {"a": 1}, [float("inf")] * len(vocab)):
        hostile = {**payload, "vocab": {**payload["vocab"], "counts": counts}}
        with pytest.raises(CaptionerError, match="its vocabulary is malformed"):
            build_checkpoint_model(hostile, path)
    for endings in ("x", 5, [[1]], [["a", "b"]], [[1, len(vocab)]], [[-1, 2]], [[1, 2, 3]], [[1.9, 2]],
                    [[float("inf"), 2]], ["12"], [[[1], 2]]):
        hostile = {**payload, "vocab": {**payload["vocab"], "endings": endings}}
        with pytest.raises(CaptionerError, match="its vocabulary is malformed"):
            build_checkpoint_model(hostile, path)


def test_diversity_measures_by_hand():
    measures = diversity_measures({1: "a dog runs", 2: "a dog runs", 3: "a man on a man on grass", 4: "a cat cat sits with"})
    assert measures["vocabulary_used"] == 9
    assert measures["distinct_captions"] == 0.5
    assert measures["repeated_word"] == 0.25 and measures["repeated_bigram"] == 0.25
    assert measures["dangling_end"] == 0.25 and measures["mean_length"] == (3 + 3 + 7 + 5) / 4


def test_bad_settings_are_refused():
    from captioner.errors import CaptionerError

    for bad in (DecodeConfig(beam=3, beam_groups=2), DecodeConfig(beam=3, n_best=4), DecodeConfig(method="nucleus"),
                DecodeConfig(method="sample", temperature=0.0)):
        with pytest.raises(CaptionerError, match="decode"):
            decode(lstm(), features(1), VOCAB, bad)


def test_cli_n_best_json_ensembles_and_the_scores_file(tiny_coco, tmp_path, capsys):
    from captioner.cli import main
    from captioner.training.engine import train
    from tests.conftest import tiny_config

    one = train(tiny_config(tiny_coco, tmp_path / "a", train={"epochs": 1}))["checkpoint"]
    two = train(tiny_config(tiny_coco, tmp_path / "b", train={"epochs": 1}, run={"seed": 1}))["checkpoint"]
    image = str(tiny_coco / "images" / "test" / "300.png")
    capsys.readouterr()
    assert main(["caption", image, "--checkpoint", one, "--beam", "3", "--n-best", "3", "--json", "--device", "cpu"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert len(printed["beams"]) == 3 and printed["beams"][0]["caption"] == printed["caption"]
    assert len(printed["attention"]["alpha"]) == len(printed["words"]) and printed["grid"] == [2, 2]
    assert main(["caption", image, "--checkpoint", one, "--checkpoint", two, "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith(image)
    assert main(["evaluate", "--checkpoint", one, "--checkpoint", two, "--split", "test",
                 "--out", str(tmp_path / "ensemble"), "--n-best", "2",
                 "--device", "cpu", "decode.block_ngram=2"]) == 0
    scores = json.loads((tmp_path / "ensemble" / "scores_test.json").read_text())
    assert scores["decode"]["block_ngram"] == 2 and scores["decode"]["suppress_unk"] is True
    assert {"vocabulary_used", "distinct_captions", "repeated_word", "dangling_end"} <= scores["diversity"].keys()
    nbest = json.loads((tmp_path / "ensemble" / "nbest_test.json").read_text())
    assert len(nbest) == 6 and all(len(item["beams"]) == 2 for item in nbest)
    other = train(tiny_config(tiny_coco, tmp_path / "c", train={"epochs": 1}, data={"vocab_max_size": 7}))["checkpoint"]
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", one, "--checkpoint", other, "--split", "test", "--device", "cpu"]) == 1
    assert "an ensemble needs one vocabulary" in capsys.readouterr().err
