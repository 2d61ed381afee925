"""Self-critical sequence training (Rennie et al. 2017): optimise the caption metric itself.

For each image of a batch, k captions are drawn in one batched pass through the decode-step interface (so every
decoder works) and scored against the image's references (CIDEr-D, optionally plus BLEU-4:
:mod:`captioner.objectives.rewards`); REINFORCE raises the log-probability of those above a baseline and lowers
it for those below:

    loss = - sum_{i, t} (r_i - b_i) * log p(w_it) / (sampled words)

The baseline ``b_i`` is the mean reward of the image's other k - 1 samples (``mean``, Luo 2020) or the reward
of its greedy caption (``greedy``, the original). Words after a caption's ``<end>`` get no gradient. The
captions are drawn with the decoder's dropout on (as in the self-critical code base) or off (``dropout=False``: the
policy reinforced is the one that decodes). With ``xe_weight`` the cross-entropy of a reference caption per image
is added, weighted, so that the policy stays near the human captions. For hard attention the sampled locations
share the caption's reward, and ``loss.entropy_weight`` stays available.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from captioner.core.floats import widened
from captioner.data.text import tokenize
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import TokenRules, sample_captions
from captioner.models.attention import attention_entropy
from captioner.objectives.losses import caption_baseline
from captioner.objectives.rewards import cached_cider, sentence_bleu4

RewardFunction = Callable[[list[list[str]], list[int], list[bool]], np.ndarray]
"""``reward(captions, image_ids, ended)``: per caption (its words, its image, whether it closed with ``<end>``)."""


@contextmanager
def dropout_off(module: torch.nn.Module, off: bool = True):
    """Within the block, every dropout layer of ``module`` passes its input through (when ``off``); the rest of
    the module stays in its mode (hard attention keeps sampling locations in training)."""
    layers = [m for m in module.modules() if isinstance(m, torch.nn.Dropout) and m.training] if off else []
    for layer in layers:
        layer.eval()
    try:
        yield
    finally:
        for layer in layers:
            layer.train()


def caption_words(tokens: torch.Tensor, vocab: Vocabulary) -> list[list[str]]:
    """The words of each row of ``tokens`` (N, T), up to its ``<end>``."""
    return [vocab.decode_tokens(row) for row in tokens.tolist()]


def metric_reward(references: dict[int, list[str]], cache_folder, *, count_end: bool, bleu_weight: float) -> RewardFunction:
    """CIDEr-D (document frequencies of ``references``, cached in ``cache_folder``) plus ``bleu_weight`` times
    sentence BLEU-4, per caption: a :data:`RewardFunction`."""
    words = {image: [tokenize(c) for c in captions] for image, captions in references.items()}
    cider = cached_cider(words, cache_folder, count_end=count_end)

    def reward(captions: list[list[str]], image_ids: list[int], ended: list[bool]) -> np.ndarray:
        scores = cider.scores(captions, image_ids, ended)
        if bleu_weight:
            scores += bleu_weight * np.array([sentence_bleu4(c, words[i]) for c, i in zip(captions, image_ids)])
        return scores

    return reward


def mean_of_others(rewards: torch.Tensor, samples: int) -> torch.Tensor:
    """Per sample, the mean reward of the other ``samples - 1`` samples of its image; ``rewards`` (B * k,), each
    image's k = ``samples`` adjacent (hard attention's caption baseline, with k rows per image)."""
    return caption_baseline(rewards, torch.full((len(rewards) // samples,), samples, device=rewards.device))


def policy_loss(advantage: torch.Tensor, log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``-sum (advantage * log_probs)`` over the sampled positions, per sampled word; ``advantage`` (N,),
    ``log_probs`` and ``mask`` (N, T)."""
    return -(advantage[:, None] * log_probs * mask).sum() / mask.sum().clamp_min(1)


class SelfCritical:
    """The self-critical objective of one run: its reward, baseline and sampling settings."""

    def __init__(self, reward: RewardFunction, vocab: Vocabulary, *, samples: int = 5, baseline: str = "mean",
                 temperature: float = 1.0, max_length: int = 20, suppress_unk: bool = True, entropy_weight: float = 0.0,
                 dropout: bool = True, xe_weight: float = 0.0, cross_entropy=None):
        if baseline not in ("mean", "greedy"):
            raise ValueError(f"train.scst_baseline must be mean or greedy, not {baseline!r}")
        if baseline == "mean" and samples < 2:
            raise ValueError("train.scst_baseline=mean needs train.scst_samples >= 2")
        self.reward, self.vocab, self.samples, self.baseline = reward, vocab, samples, baseline
        self.temperature, self.max_length, self.entropy_weight = temperature, max_length, entropy_weight
        self.dropout, self.xe_weight, self.cross_entropy = dropout, xe_weight, cross_entropy
        if xe_weight and cross_entropy is None:
            raise ValueError("a cross-entropy weight needs the cross-entropy loss")
        self.rules = TokenRules(vocab.start_index, vocab.end_index, vocab.pad_index,
                                vocab.unk_index if suppress_unk else None)

    def rewards(self, tokens: torch.Tensor, image_ids: Sequence[int]) -> torch.Tensor:
        """The reward of each row of ``tokens`` (N, T) for its image; a row without ``<end>`` was cut at the
        length limit, and is scored as such."""
        ended = self.ended(tokens).tolist()
        return torch.from_numpy(self.reward(caption_words(tokens, self.vocab), list(image_ids), ended)).to(
            torch.get_default_dtype())

    def ended(self, tokens: torch.Tensor) -> torch.Tensor:
        """Per row of ``tokens`` (N, T): whether it wrote ``<end>`` (else it was cut at the length limit)."""
        return (tokens == self.vocab.end_index).any(dim=1)

    def __call__(self, decoder, regions: torch.Tensor, image_ids: Sequence[int],
                 references: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The loss of one batch: ``regions`` (B, L, D) of the images ``image_ids``, and with a cross-entropy weight
        one reference caption per image, ``references`` (B, T+1); the decoder in training mode."""
        with dropout_off(decoder, not self.dropout):
            drawn = sample_captions(decoder, regions, rules=self.rules, max_length=self.max_length,
                                    samples=self.samples, temperature=self.temperature)
        repeated = [i for i in image_ids for _ in range(self.samples)]
        rewards = self.rewards(drawn.tokens, repeated).to(regions.device)
        baseline = mean_of_others(rewards, self.samples) if self.baseline == "mean" else self.greedy_rewards(
            decoder, regions, image_ids).repeat_interleave(self.samples)
        mask = drawn.mask.float()
        log_probs = drawn.log_probs
        out = {}
        if decoder.samples_locations:               # hard attention: the sampled locations share the reward
            alpha = widened(drawn.attention["alpha"])
            log_probs = log_probs + (alpha * drawn.attention["chosen"]).sum(-1).clamp_min(1e-12).log() * mask
            out["attention_entropy"] = attention_entropy(alpha).mul(mask).sum() / mask.sum()
        loss = policy_loss(rewards - baseline, log_probs, mask)
        if "attention_entropy" in out and self.entropy_weight:
            loss = loss - self.entropy_weight * out["attention_entropy"]
        if self.xe_weight:
            if references is None:
                raise ValueError("a cross-entropy weight needs a reference caption per image")
            out["cross_entropy"] = self.cross_entropy(decoder(regions, references), references[:, 1:])["loss"]
            loss = loss + self.xe_weight * out["cross_entropy"]
        words = (drawn.mask & (drawn.tokens != self.vocab.end_index)).sum(dim=1).float()
        return {**out, "loss": loss, "words": drawn.mask.sum(), "reward": rewards.mean(), "baseline": baseline.mean(),
                "sample_entropy": (drawn.entropy * mask).sum() / mask.sum(), "caption_length": words.mean(),
                "cut_share": (~self.ended(drawn.tokens)).float().mean()}

    @torch.no_grad()
    def greedy_rewards(self, decoder, regions: torch.Tensor, image_ids: Sequence[int]) -> torch.Tensor:
        """The rewards of the images' greedy captions (decoded in evaluation mode)."""
        decoder.eval()
        try:
            greedy = sample_captions(decoder, regions, rules=self.rules, max_length=self.max_length, temperature=0)
        finally:
            decoder.train()
        return self.rewards(greedy.tokens, image_ids).to(regions.device)
