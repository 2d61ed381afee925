"""Training objectives: word cross-entropy with the doubly stochastic term (soft attention, the
Transformer), the variational lower bound trained by REINFORCE (hard attention, Xu et al. 2015 §4.1), and the
lower bound of variational attention (Deng et al. 2018).

:func:`build_loss` picks the loss module by whether the decoder samples locations (see
:mod:`captioner.models.decoder`); a loss module maps a :class:`~captioner.models.decoder.TeacherForced`
output and its targets (B, T) to a dict with ``loss`` (what is minimised), ``cross_entropy`` (per word, what
is reported) and ``words`` (real words), plus the terms it adds. Its state (the REINFORCE baseline) is saved
in checkpoints beside the model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from captioner.core.floats import widened
from captioner.core.settings import check_settings, setting
from captioner.data.tokens import PAD_INDEX
from captioner.kernels.word_loss import word_negative_log_likelihood
from captioner.models.decoder import TeacherForced


@dataclass
class LossConfig:
    """The ``loss`` section: the word loss, the attention regulariser and hard attention's REINFORCE terms."""

    doubly_stochastic: float = setting(1.0, "lambda of the doubly stochastic attention regulariser", minimum=0)
    doubly_stochastic_scale: str = setting(
        "caption", "caption: the term per caption | word: per word, as the cross-entropy (the paper's balance)",
        choices=("caption", "word"))
    label_smoothing: float = setting(0.0, "mix of the uniform distribution into the word targets (hard attention: "
                                     "into its likelihood term; its reward stays the plain log-likelihood)",
                                     minimum=0, below=1)
    entropy_weight: float = setting(0.002, "hard attention: lambda_e of the entropy bonus", minimum=0)
    baseline_decay: float = setting(0.9, "hard attention: b_k = decay * b_{k-1} + (1 - decay) * reward",
                                    minimum=0, maximum=1)
    hard_reward: str = setting(
        "sequence", "hard attention: sequence: log p(y | s, a) (the paper) | per_word: divided by caption length | "
        "word: each word's own log p(y_t | s, a) rewards its location s_t alone (capgen.py with RL_sumCost off; "
        "biased: through the recurrence s_t also shapes the words after t)",
        choices=("sequence", "per_word", "word"))
    hard_baseline: str = setting(
        "moving", "hard attention: moving: a moving average of the reward (the paper) | caption: the mean reward of "
        "the caption's other location samples (model.lstm.location_samples >= 2) | none (capgen.py with RL_sumCost "
        "off)",
        choices=("moving", "caption", "none"))
    reinforce_scale: float = setting(
        1.0, "hard and variational attention: the weight of the REINFORCE term beside the likelihood term, both per "
        "word (capgen.py's is batch_size / 10: its REINFORCE gradient is divided by 10, not averaged over the batch)",
        minimum=0)

    def check(self) -> None:
        check_settings(self, "loss")


def doubly_stochastic_term(alpha: torch.Tensor, mask: torch.Tensor, weight: float,
                           scale: str = "caption") -> torch.Tensor:
    """``weight * sum_i (1 - sum_t alpha_ti)^2`` (Xu et al. eq. 14), real steps only.

    ``alpha`` (B, T, L), ``mask`` (B, T) true at real (non-padding) steps. ``scale="caption"`` averages the
    term over captions; ``"word"`` sums it over captions and divides by the number of real words, as the
    cross-entropy beside it is (the paper's balance: its likelihood term is summed over a caption's words).
    Raises ``ValueError`` for another ``scale``.
    """
    if scale not in ("caption", "word"):
        raise ValueError(f"loss.doubly_stochastic_scale must be caption or word, not {scale!r}")
    coverage = (widened(alpha) * mask.unsqueeze(-1)).sum(dim=1)            # (B, L)
    per_caption = ((1.0 - coverage) ** 2).sum(dim=1)                        # (B,)
    if scale == "word":
        return weight * per_caption.sum() / mask.sum().clamp_min(1)
    return weight * per_caption.mean()


def caption_loss(logits: torch.Tensor, targets: torch.Tensor, alpha: torch.Tensor | None,
                 doubly_stochastic: float, pad_index: int = 0, label_smoothing: float = 0.0,
                 doubly_stochastic_scale: str = "caption") -> dict[str, torch.Tensor]:
    """Loss of a teacher-forced batch.

    ``logits`` (W, V) predict the W real words of ``targets`` (B, T) (``targets[targets != pad_index]``, the
    decoders' :class:`~captioner.models.decoder.TeacherForced` layout); padded logits (B, T, V) are packed
    first. ``cross_entropy`` is the mean negative log-likelihood of the real words (what is reported); the
    optimised word term mixes it with the mean over the vocabulary of ``-log p`` by ``label_smoothing``.
    ``attention`` is the doubly stochastic term.
    """
    mask = targets != pad_index
    words = mask.sum()
    logits = logits[mask] if logits.dim() == 3 else logits
    negative_log_likelihood, uniform = word_negative_log_likelihood(logits, targets[mask], label_smoothing > 0)
    cross_entropy = negative_log_likelihood / words
    word_loss = cross_entropy
    if label_smoothing > 0:
        word_loss = (1 - label_smoothing) * cross_entropy + label_smoothing * uniform / words
    out = {"cross_entropy": cross_entropy, "words": words}
    if alpha is not None and doubly_stochastic > 0:
        out["attention"] = doubly_stochastic_term(alpha, mask, doubly_stochastic, doubly_stochastic_scale)
        out["loss"] = word_loss + out["attention"]
    else:
        out["loss"] = word_loss
    return out


class CaptionLoss(nn.Module):
    """The likelihood objective: (label-smoothed) word cross-entropy plus the doubly stochastic term."""

    def __init__(self, loss_config: LossConfig):
        super().__init__()
        self.config = loss_config

    def forward(self, out: TeacherForced, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        c = self.config
        return caption_loss(out.logits, targets, out.alpha, c.doubly_stochastic, label_smoothing=c.label_smoothing,
                            doubly_stochastic_scale=c.doubly_stochastic_scale)


class HardAttentionLoss(nn.Module):
    """Surrogate loss whose gradient is the paper's estimator of ``-dL_s/dW`` (§4.1), with its moving-average
    baseline as a buffer. For sampled locations ``s``:

        grad = d log p(y|s,a)/dW + (r - b) * d log p(s|a)/dW + entropy_weight * dH[s]/dW

    Rows in ``out.expectation_rows`` get the likelihood gradient alone; terms are per real word. ``r`` is
    ``log p(y|s,a)``, per caption or divided by its length (``hard_reward``), or each word's own ``log p(y_t|s,a)``
    for its location ``s_t`` alone (``word``); ``b`` (``hard_baseline``) a moving average of the rewards, the mean
    reward of the caption's other samples (at the same word, for ``word``), or none. The moving average is kept,
    updated in training mode and reported as ``baseline`` under every choice (a running record of the reward), and
    subtracted only under ``moving``. The REINFORCE term is weighted by ``reinforce_scale``. ``label_smoothing``
    mixes the uniform targets into the likelihood term only (as :func:`caption_loss` does); the reward stays
    unsmoothed.
    """

    def __init__(self, loss_config: LossConfig):
        super().__init__()
        self.config = loss_config
        self.register_buffer("baseline", torch.zeros(()))
        self.register_buffer("baseline_updates", torch.zeros((), dtype=torch.long))

    def forward(self, out: TeacherForced, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        c = self.config
        if out.repeats is not None:
            targets = targets.repeat_interleave(out.repeats, 0)
        word_log_probs, mask = word_log_likelihoods(out.logits, targets)
        log_likelihood = word_log_probs.sum(dim=1)
        words = mask.sum()
        cross_entropy = -log_likelihood.sum() / words
        per_word = c.hard_reward == "word"
        sampled = ~out.expectation_rows
        # the rewards that train: the sampled rows' (B',), or their real words' (B', T)
        counted = sampled[:, None] & mask if per_word else sampled
        reward = word_log_probs.detach() if per_word else location_reward(log_likelihood, mask.sum(dim=1),
                                                                             c.hard_reward)
        if self.training and self.baseline_updates == 0 and counted.any():
            self.baseline.copy_(reward[counted].mean())    # the first batch sets b instead of comparing with 0
        if c.hard_baseline == "caption":
            baseline = caption_baseline(reward, out.repeats)
        else:
            baseline = self.baseline if c.hard_baseline == "moving" else torch.zeros_like(self.baseline)
        advantage = (reward - baseline) * counted
        location_log_prob = widened(out.log_prob_location) * mask
        location_log_prob = location_log_prob if per_word else location_log_prob.sum(dim=1)
        reinforce = c.reinforce_scale * reinforce_term(advantage, location_log_prob, words)
        entropy = (widened(out.entropy) * mask).sum() / words
        result = {"cross_entropy": cross_entropy, "words": words, "reinforce": reinforce, "entropy": entropy,
                  "reward": (reward[mask] if per_word else reward).mean(), "baseline": self.baseline.detach().clone()}
        word_loss = cross_entropy
        if c.label_smoothing > 0:       # -sum_w mean_v log p_w(v), the uniform targets' cross-entropy
            spread = -F.log_softmax(widened(out.logits), dim=-1).mean(dim=-1).sum()
            word_loss = (1 - c.label_smoothing) * cross_entropy + c.label_smoothing * spread / words
        loss = word_loss + reinforce - c.entropy_weight * entropy
        if c.doubly_stochastic > 0:
            result["attention"] = doubly_stochastic_term(out.alpha, mask, c.doubly_stochastic, c.doubly_stochastic_scale)
            loss = loss + result["attention"]
        result["loss"] = loss
        if self.training and counted.any():
            with torch.no_grad():
                self.baseline.mul_(c.baseline_decay).add_((1 - c.baseline_decay) * reward[counted].mean())
                self.baseline_updates.add_(1)
        return result


class VariationalAttentionLoss(nn.Module):
    """Variational attention's objective (Deng et al. 2018), per real word: the soft branch's cross-entropy (what
    decoding uses, and what is reported), the negative lower bound ``-E_q[log p(y_t|s_t)] + KL(q_t || alpha_t)``
    with one drawn ``s_t``, and REINFORCE for q with the per-word reward ``log p(y_t|s_t) - log p(y_t|z_t)``, the
    soft context's log-likelihood as its baseline (weighted by ``reinforce_scale``). ``label_smoothing`` mixes the
    uniform targets into both word terms; the doubly stochastic term applies to alpha. Out of training (no draws)
    it is :func:`caption_loss`."""

    def __init__(self, loss_config: LossConfig):
        super().__init__()
        self.config = loss_config

    def forward(self, out: TeacherForced, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        c = self.config
        result = caption_loss(out.logits, targets, out.alpha, c.doubly_stochastic, label_smoothing=c.label_smoothing,
                              doubly_stochastic_scale=c.doubly_stochastic_scale)
        if out.sampled_logits is None:
            return result
        drawn = caption_loss(out.sampled_logits, targets, None, 0.0, label_smoothing=c.label_smoothing)
        soft_words, mask = word_log_likelihoods(out.logits, targets)
        drawn_words, _ = word_log_likelihoods(out.sampled_logits, targets)
        reward = (drawn_words - soft_words).detach()                                    # (B, T), 0 at padding
        words = result["words"]
        result |= {"drawn_cross_entropy": drawn["cross_entropy"], "reward": reward[mask].mean(),
                   "reinforce": c.reinforce_scale * reinforce_term(reward, widened(out.log_prob_location) * mask, words),
                   "kl": (widened(out.kl) * mask).sum() / words}
        result["loss"] = result["loss"] + drawn["loss"] + result["reinforce"] + result["kl"]
        return result


def word_log_likelihoods(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``log p(y_t|s,a)`` of each word (B', T), 0 at padding, from the logits (W, V) of the W real words (the
    :class:`~captioner.models.decoder.TeacherForced` layout) and ``targets`` (B', T), and the mask (B', T) of the
    real words."""
    mask = targets != PAD_INDEX
    word_log_probs = -F.cross_entropy(widened(logits), targets[mask], reduction="none")          # (W,)
    return word_log_probs.new_zeros(mask.shape).masked_scatter(mask, word_log_probs), mask


def caption_log_likelihood(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``log p(y|s,a)`` of each caption (B',), and the mask (B', T) of the real words (see
    :func:`word_log_likelihoods`)."""
    word_log_probs, mask = word_log_likelihoods(logits, targets)
    return word_log_probs.sum(dim=1), mask


def location_reward(log_likelihood: torch.Tensor, lengths: torch.Tensor, kind: str) -> torch.Tensor:
    """REINFORCE's reward ``r`` of each caption's sampled locations (B',), detached: its log-likelihood
    (``"sequence"``, the paper) or that per word (``"per_word"``; ``lengths`` (B',) the real words)."""
    return log_likelihood.detach() / (lengths.clamp_min(1) if kind == "per_word" else 1)


def caption_baseline(reward: torch.Tensor, repeats: torch.Tensor | None) -> torch.Tensor:
    """Per row of ``reward`` (B',) or (B', T), the rows of each caption adjacent (``repeats`` (B,) of them, summing
    to B'): the mean reward of the caption's other rows (at the same word, for (B', T); 0 for a caption of one row:
    on the expectation, it has no advantage anyway)."""
    if repeats is None:
        return torch.zeros_like(reward)
    caption = torch.arange(len(repeats), device=reward.device).repeat_interleave(repeats)
    totals = reward.new_zeros(len(repeats), *reward.shape[1:]).index_add_(0, caption, reward)
    others = (repeats[caption] - 1).clamp_min(1).view(-1, *[1] * (reward.dim() - 1))
    return (totals[caption] - reward) / others


def reinforce_term(advantage: torch.Tensor, location_log_prob: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """``-sum_rows (r - b) sum_t log alpha_t[s_t]`` divided by the ``words``: the surrogate whose gradient is
    REINFORCE's estimate (§4.1); ``advantage`` ``r - b`` and ``location_log_prob`` (B',), or both (B', T) for a
    reward per word (``-sum_rows sum_t (r_t - b_t) log alpha_t[s_t]``)."""
    return -(advantage * location_log_prob).sum() / words


def build_loss(decoder, loss_config: LossConfig) -> nn.Module:
    """The loss module that fits ``decoder`` under the config's ``loss`` section: :class:`HardAttentionLoss` for a
    decoder that samples locations, :class:`VariationalAttentionLoss` for variational attention, else
    :class:`CaptionLoss`."""
    if decoder.samples_locations:
        return HardAttentionLoss(loss_config)
    return (VariationalAttentionLoss if getattr(decoder, "variational", False) else CaptionLoss)(loss_config)
