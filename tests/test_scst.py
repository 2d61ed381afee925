"""Self-critical sequence training: the CIDEr-D reward equals pycocoevalcap's, the baselines, the policy
gradient's invariants, a toy task driven to its reward, and SCST runs through the engine (switch within a
run, from a checkpoint, resume, real COCO files)."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider

from captioner.data.dataset import CaptionDataset
from captioner.data.readers import read_split
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import TokenRules, greedy, sample_captions
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.objectives.rewards import CiderD, cached_cider, sentence_bleu4
from captioner.objectives.scst import SelfCritical, mean_of_others, policy_loss
from captioner.training import engine
from captioner.training.engine import begin_self_critical, train
from tests.conftest import tiny_config
from tests.test_training import scripted_validation

COCO_MINI = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "coco-mini"
REFERENCES = {
    1: ["a dog runs on the grass", "a brown dog running", "the dog runs fast on green grass"],
    2: ["a man rides a bike", "a man riding a bicycle down the street", "a person on a bike"],
    3: ["two cats sleep on a sofa", "cats sleeping", "two cats on a couch sleeping"],
    4: ["a red bus on the road", "a bus drives down a road", "a red double decker bus"],
}
CANDIDATES = {1: "a dog runs on the grass grass grass", 2: "a zorblax rides a bike", 3: "", 4: "a red bus"}


def test_cider_d_equals_pycocoevalcap_with_repeats_unknown_words_and_empty_captions():
    ours = CiderD({i: [r.split() for r in refs] for i, refs in REFERENCES.items()})
    scores = ours.scores([CANDIDATES[i].split() for i in REFERENCES], list(REFERENCES))
    reference, per_image = Cider().compute_score(REFERENCES, {i: [c] for i, c in CANDIDATES.items()})
    assert scores.mean() == pytest.approx(reference, abs=1e-6)
    np.testing.assert_allclose(scores, per_image, atol=1e-6)
    # <end> counted as a word: the same as pycocoevalcap on captions that end with it
    with_end = CiderD({i: [r.split() for r in refs] for i, refs in REFERENCES.items()}, count_end=True)
    ended, _ = Cider().compute_score({i: [r + " <end>" for r in refs] for i, refs in REFERENCES.items()},
                                     {i: [(c + " <end>").strip()] for i, c in CANDIDATES.items()})
    assert with_end.scores([CANDIDATES[i].split() for i in REFERENCES], list(REFERENCES)).mean() == pytest.approx(ended, abs=1e-6)


def test_a_caption_cut_at_the_length_limit_gets_no_end_in_its_reward():
    with_end = CiderD({i: [r.split() for r in refs] for i, refs in REFERENCES.items()}, count_end=True)
    cut, _ = Cider().compute_score({i: [r + " <end>" for r in refs] for i, refs in REFERENCES.items()},
                                   {i: [c] for i, c in CANDIDATES.items()})
    captions, ids = [CANDIDATES[i].split() for i in REFERENCES], list(REFERENCES)
    assert with_end.scores(captions, ids, [False] * 4).mean() == pytest.approx(cut, abs=1e-6)
    # the self-critical objective tells them apart by the <end> token in the sampled row
    seen = []
    objective = SelfCritical(lambda captions, ids, ended: seen.append((captions, ended)) or np.zeros(len(ids)),
                             VOCAB, samples=2, max_length=3)
    end, w = VOCAB.end_index, VOCAB.index["w1"]
    objective.rewards(torch.tensor([[w, end, 0], [w, w, w]]), [0, 0])
    assert seen == [([["w1"], ["w1", "w1", "w1"]], [True, False])]


def test_cached_document_frequencies_give_the_same_scores(tmp_path):
    words = {i: [r.split() for r in refs] for i, refs in REFERENCES.items()}
    first = cached_cider(words, tmp_path, count_end=True)
    assert len(list(tmp_path.glob("cider-df-*.json.gz"))) == 1
    again = cached_cider(words, tmp_path, count_end=True)             # read back from the file
    captions, ids = [CANDIDATES[i].split() for i in REFERENCES], list(REFERENCES)
    np.testing.assert_allclose(first.scores(captions, ids), again.scores(captions, ids), rtol=0, atol=0)
    cached_cider({1: [["other"]]}, tmp_path, count_end=True)          # another split: another file
    assert len(list(tmp_path.glob("cider-df-*.json.gz"))) == 2


def test_sentence_bleu4_equals_pycocoevalcaps_per_image_bleu():
    _, per_image = Bleu(4).compute_score(REFERENCES, {i: [c] for i, c in CANDIDATES.items()})
    ours = [sentence_bleu4(CANDIDATES[i].split(), [r.split() for r in REFERENCES[i]]) for i in REFERENCES]
    np.testing.assert_allclose(ours, per_image[3], rtol=1e-9, atol=1e-12)
    assert sentence_bleu4("a red bus on the road".split(), ["a red bus on the road".split()]) == pytest.approx(1.0)


def test_the_mean_baseline_excludes_the_sample_itself():
    rewards = torch.tensor([1.0, 2.0, 6.0, 0.0, 0.0, 3.0])
    torch.testing.assert_close(mean_of_others(rewards, 3), torch.tensor([4.0, 3.5, 1.5, 1.5, 1.5, 0.0]))


VOCAB = Vocabulary(["<pad>", "<start>", "<end>", "<unk>"] + [f"w{i}" for i in range(12)])


def decoder(**kw) -> LSTMDecoder:
    torch.manual_seed(0)
    options = dict(vocab_size=len(VOCAB), region_dim=8, grid=(2, 2), attention_dim=8, embed_dim=8, hidden_dim=16,
                   dropout=0.0) | kw
    return LSTMDecoder(LSTMDecoderConfig(**options)).train()


@pytest.mark.parametrize("baseline", ["mean", "greedy"])
@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_a_constant_reward_gives_zero_gradient(baseline, mode):
    model = decoder(attention_mode=mode)
    objective = SelfCritical(lambda captions, ids, ended: np.full(len(captions), 3.0), VOCAB, samples=4, baseline=baseline,
                             max_length=6)
    losses = objective(model, torch.randn(3, 4, 8), [0, 1, 2])
    losses["loss"].backward()
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in model.parameters())
    assert losses["reward"].item() == pytest.approx(3.0) and losses["baseline"].item() == pytest.approx(3.0)


def test_positions_after_end_get_no_gradient():
    model = decoder()
    with torch.no_grad():
        model.out_words.bias[VOCAB.end_index] += 3.0                     # many captions end early
    drawn = sample_captions(model, torch.randn(6, 4, 8), rules=TokenRules(1, 2), max_length=8, samples=2)
    after = ~drawn.mask
    assert after.any() and (drawn.tokens[after] == VOCAB.pad_index).all() and (drawn.log_probs[after] == 0).all()
    grads = torch.autograd.grad(drawn.log_probs[after].sum(), list(model.parameters()), allow_unused=True)
    assert all(g is None or g.abs().max() == 0 for g in grads)
    # the loss is a mean over sampled words only
    advantage = torch.randn(12)
    manual = -sum(advantage[i] * drawn.log_probs[i, drawn.mask[i]].sum() for i in range(12)) / drawn.mask.sum()
    torch.testing.assert_close(policy_loss(advantage, drawn.log_probs, drawn.mask.float()), manual)


def test_an_easy_reward_is_driven_to_its_maximum():
    """Two images, one reference each: self-critical training alone, from random weights, makes greedy decoding
    write each image's reference."""
    torch.manual_seed(0)
    model = decoder(attention="none")
    regions = torch.randn(2, 4, 8) * 2
    targets = {0: "w5 w6 w7".split(), 1: "w8 w9".split()}
    cider = CiderD({i: [words] for i, words in targets.items()}, count_end=True)
    objective = SelfCritical(lambda captions, ids, ended: cider.scores(captions, ids, ended), VOCAB, samples=8, max_length=5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(300):
        losses = objective(model, regions, [0, 1])
        optimizer.zero_grad()
        losses["loss"].backward()
        optimizer.step()
    best = greedy(model.eval(), regions, max_length=5, rules=TokenRules(1, 2))
    assert [VOCAB.decode_tokens(g.tokens) for g in best] == [targets[0], targets[1]]


def test_scst_after_cross_entropy_in_one_run_resumes_exactly_and_logs_rewards(tiny_coco, tmp_path):
    scst = {"objective": "scst", "scst_after_epoch": 1, "scst_samples": 3, "epochs": 3, "lr": 0.005}
    full = train(tiny_config(tiny_coco, tmp_path / "full", train=scst))
    records = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["type"] == "train"]
    assert {r["objective"] for r in steps} == {"xe", "scst"}
    assert all({"reward", "baseline", "sample_entropy", "caption_length"} <= r.keys() for r in steps if r["objective"] == "scst")
    assert full["step"] == 5 + 2 * 3                                    # 24 pairs / 5; then 12 images / 5 per epoch
    train(tiny_config(tiny_coco, tmp_path / "split", train={**scst, "epochs": 2}))
    train(tiny_config(tiny_coco, tmp_path / "split", train=scst), resume=True)
    a, b = (torch.load(tmp_path / name / "last.pt", weights_only=True)["model"] for name in ("full", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert list((tmp_path).glob("**/cider-df-*.json.gz"))               # document frequencies cached once


def test_cross_entropy_that_stops_gaining_hands_its_best_epoch_to_scst_and_resumes_exactly(tiny_coco, tmp_path,
                                                                                            monkeypatch):
    scst = {"objective": "scst", "scst_after_epoch": 10, "early_stopping": 2, "scst_lr": 0.001, "lr": 0.005,
            "scst_samples": 3, "scst_batch_size": 4, "epochs": 5}
    scores = (0.5, 0.4, 0.3, 0.55, 0.42)        # cross-entropy's best at epoch 1, no gain at 2 and 3: the switch
    switched = []

    def begin(run, state):
        begin_self_critical(run, state)
        switched.append({k: v.clone() for k, v in run.model.state_dict().items()})

    monkeypatch.setattr(engine, "begin_self_critical", begin)
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores))
    result = train(tiny_config(tiny_coco, tmp_path / "full", train=scst))
    steps = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    objectives = {r["epoch"]: (r["objective"], r["lr"]) for r in steps if r["type"] == "train"}
    assert objectives == {1: ("xe", 0.005), 2: ("xe", 0.005), 3: ("xe", 0.005), 4: ("scst", 0.001), 5: ("scst", 0.001)}
    assert result["step"] == 3 * 5 + 2 * 3                              # 24 pairs / 5, then 12 images / 4 per epoch
    assert result["epochs"] == 5 and torch.load(tmp_path / "full" / "last.pt", weights_only=True)["progress"]["scst_from"] == 3
    start = torch.load(tmp_path / "full" / "cross_entropy.pt", weights_only=True)
    assert start["progress"]["epoch"] == 1 and len(switched) == 1      # self-critical from epoch 1's weights, kept
    assert all(torch.equal(switched[0][k], start["model"][k]) for k in start["model"])
    assert torch.load(tmp_path / "full" / "best.pt", weights_only=True)["progress"]["epoch"] == 4   # SCST's gain
    # stopped at the switch, resumed with the epochs left: the same weights as the run in one go
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores[:3]))
    train(tiny_config(tiny_coco, tmp_path / "split", train={**scst, "epochs": 3}))
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores[3:]))
    train(tiny_config(tiny_coco, tmp_path / "split", train=scst), resume=True)
    a, b = (torch.load(tmp_path / name / "last.pt", weights_only=True)["model"] for name in ("full", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_self_critical_stages_keep_their_rate_and_their_own_patience(tiny_coco, tmp_path, monkeypatch):
    """Plateau decays act on cross-entropy epochs only; after the switch, train.scst_patience epochs without a
    gain over the best SCST epoch end the run, not train.early_stopping: SCST climbing below its start goes on."""
    scst = {"objective": "scst", "scst_after_epoch": 4, "early_stopping": 1, "scst_patience": 3, "scst_lr": 0.001,
            "lr": 0.005, "lr_schedule": "plateau", "lr_patience": 1, "lr_gamma": 0.5, "scst_samples": 2,
            "scst_batch_size": 4, "epochs": 10}
    scores = (0.5, 0.4, 0.3, 0.35, 0.45, 0.44, 0.45, 0.42, 0.9, 0.9)
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores))
    result = train(tiny_config(tiny_coco, tmp_path / "run", train=scst))
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rates = {r["epoch"]: r["lr"] for r in steps if r["type"] == "train"}
    assert rates == {1: 0.005, 2: 0.005, **dict.fromkeys(range(3, 9), 0.001)}   # the switch after epoch 2, constant
    assert result["epochs"] == 8          # SCST below 0.5 throughout; three epochs without passing its 0.45, then stop
    best = torch.load(tmp_path / "run" / "best.pt", weights_only=True)
    assert result["best"] == 0.5 and best["progress"]["epoch"] == 1
    # cut after its second epoch without a gain and resumed: the stage's best goes on with it, the same stop
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores))
    train(tiny_config(tiny_coco, tmp_path / "split", train={**scst, "epochs": 7}))
    last = tmp_path / "split" / "last.pt"
    payload = torch.load(last, weights_only=True)
    assert payload["progress"]["stage_best"] == 0.45 and payload["progress"]["stale"] == 2
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores[7:]))
    assert train(tiny_config(tiny_coco, tmp_path / "split", train=scst), resume=True)["epochs"] == 8


def test_the_cross_entropy_weight_adds_a_reference_captions_loss():
    model = decoder(dropout=0.0)
    regions, references = torch.randn(2, 4, 8), torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]])
    reward = lambda captions, ids, ended: np.arange(len(captions), dtype=float)     # noqa: E731
    cross_entropy = lambda out, targets: {"loss": torch.nn.functional.cross_entropy(   # noqa: E731
        out.logits, targets[targets != VOCAB.pad_index])}
    mixed = SelfCritical(reward, VOCAB, samples=2, max_length=5, xe_weight=0.3, cross_entropy=cross_entropy)
    torch.manual_seed(2)
    losses = mixed(model, regions, [0, 1], references)
    torch.manual_seed(2)
    plain = SelfCritical(reward, VOCAB, samples=2, max_length=5)(model, regions, [0, 1])
    expected = cross_entropy(model(regions, references), references[:, 1:])["loss"]
    torch.testing.assert_close(losses["cross_entropy"], expected)
    torch.testing.assert_close(losses["loss"], plain["loss"] + 0.3 * expected)


def test_a_self_critical_run_with_a_cross_entropy_weight_draws_each_images_own_references_and_resumes_exactly(
        tiny_coco, tmp_path):
    scst = {"objective": "scst", "scst_samples": 2, "scst_xe_weight": 0.5, "epochs": 2, "lr": 0.005}
    config = tiny_config(tiny_coco, tmp_path / "full", train=scst)
    train(config)
    steps = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["cross_entropy"] > 0 for r in steps if r["type"] == "train")
    train(tiny_config(tiny_coco, tmp_path / "split", train={**scst, "epochs": 1}))
    train(tiny_config(tiny_coco, tmp_path / "split", train=scst), resume=True)
    a, b = (torch.load(tmp_path / name / "last.pt", weights_only=True)["model"] for name in ("full", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the references drawn for a batch of images are captions of those images, each of them drawn
    vocab = Vocabulary.from_dict(torch.load(tmp_path / "full" / "last.pt", weights_only=True)["vocab"])
    dataset = CaptionDataset(read_split(config.data, "train"), vocab, 50, transform=lambda image: image, pairs=False)
    picks = torch.tensor([3, 3, 0, 7] * 50)
    drawn = dataset.random_captions(picks)
    for row, record in zip(drawn.tolist(), picks.tolist()):
        own = {tuple(vocab.encode(c, 50)) for c in dataset.records[record].captions}
        assert tuple(t for t in row if t != VOCAB.pad_index) in own
    assert len({tuple(row) for row, r in zip(drawn.tolist(), picks.tolist()) if r == 3}) == 2    # both of its two


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_sampling_without_dropout_reinforces_the_policy_that_decodes(mode):
    model = decoder(attention_mode=mode, dropout=0.5)
    regions = torch.randn(3, 4, 8)
    objective = SelfCritical(lambda captions, ids, ended: np.arange(len(captions), dtype=float), VOCAB, samples=2,
                             max_length=6, dropout=False)
    torch.manual_seed(1)
    losses = objective(model, regions, [0, 1, 2])
    assert model.training and model.dropout.training                     # dropout back on after the draw
    losses["loss"].backward()
    assert model.out_words.weight.grad.abs().sum() > 0
    with_dropout = SelfCritical(objective.reward, VOCAB, samples=2, max_length=6)
    # the same draw with every dropout layer in evaluation mode by hand: the same loss
    for layer in (m for m in model.modules() if isinstance(m, torch.nn.Dropout)):
        layer.eval()
    torch.manual_seed(1)
    torch.testing.assert_close(with_dropout(model, regions, [0, 1, 2])["loss"], losses["loss"])
    model.dropout.train()
    torch.manual_seed(1)
    assert with_dropout(model, regions, [0, 1, 2])["loss"] != losses["loss"]


def test_scst_from_a_trained_checkpoint_keeps_its_architecture_and_vocabulary_at_its_own_rate(tiny_coco, tmp_path):
    first = train(tiny_config(tiny_coco, tmp_path / "xe", train={"epochs": 1}, model={"lstm": {"hidden_dim": 24}}))
    config = tiny_config(tiny_coco, tmp_path / "scst", train={"epochs": 1, "objective": "scst", "scst_baseline": "greedy",
                                                              "scst_samples": 2, "init_from": first["checkpoint"],
                                                              "scst_lr": 0.0007})
    result = train(config)
    payload = torch.load(result["checkpoint"], weights_only=True)
    assert payload["config"]["model"]["lstm"]["hidden_dim"] == 24
    assert payload["vocab"] == torch.load(first["checkpoint"], weights_only=True)["vocab"]
    steps = [json.loads(line) for line in (tmp_path / "scst" / "metrics.jsonl").read_text().splitlines()]
    assert {r["lr"] for r in steps if r["type"] == "train"} == {0.0007}     # train.scst_lr from the first epoch


@pytest.mark.skipif(not COCO_MINI.exists(), reason="../shared/data/coco-mini is not here")
def test_scst_runs_on_real_coco_files_through_the_official_reader(tmp_path):
    annotations = COCO_MINI / "annotations" / "captions_train2017.json"
    images = str(COCO_MINI / "train2017")
    config = tiny_config(tmp_path, tmp_path / "run", train={"epochs": 1, "objective": "scst", "scst_samples": 2,
                                                            "batch_size": 16, "val_max_images": 8},
                         encoder={"image_size": 64})
    config.data = dataclasses.replace(config.data, captions={"train": str(annotations), "val": str(annotations)},
                                      images={"train": images, "val": images}, vocab_min_count=2)
    result = train(config)
    assert result["step"] == 5 and result["epochs"] == 1                 # 80 images / 16
