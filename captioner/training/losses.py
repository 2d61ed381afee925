"""Training objectives: word cross-entropy with the doubly stochastic term (soft attention), and the
variational lower bound trained by REINFORCE (hard attention, Xu et al. 2015 §4.1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def doubly_stochastic_term(alpha: torch.Tensor, mask: torch.Tensor, weight: float, scale: str = "caption") -> torch.Tensor:
    """``weight * sum_i (1 - sum_t alpha_ti)^2`` (Xu et al. eq. 14), real steps only.

    ``alpha`` (B, T, L), ``mask`` (B, T) true at real (non-padding) steps. ``scale="caption"`` averages the
    term over captions; ``"word"`` sums it over captions and divides by the number of real words, as the
    cross-entropy beside it is: the balance of the paper's loss, whose likelihood term is summed over a
    caption's words (per caption, the term weighs T times more against a per-word cross-entropy).

    With a softmax over all L regions, ``sum_i sum_t alpha_ti = T`` for a caption of T words, so the term
    equals ``sum_i (T/L - sum_t alpha_ti)^2`` plus a constant: it penalises uneven coverage, and when T << L
    (12 words, 196 regions) every concentrated map is uneven coverage.
    """
    if scale not in ("caption", "word"):
        raise ValueError(f"model.doubly_stochastic_scale must be caption or word, not {scale!r}")
    coverage = (alpha.float() * mask.unsqueeze(-1)).sum(dim=1)             # (B, L)
    per_caption = ((1.0 - coverage) ** 2).sum(dim=1)                        # (B,)
    if scale == "word":
        return weight * per_caption.sum() / mask.sum().clamp_min(1)
    return weight * per_caption.mean()


def caption_loss(logits: torch.Tensor, targets: torch.Tensor, alpha: torch.Tensor | None,
                 doubly_stochastic: float, pad_index: int = 0, label_smoothing: float = 0.0,
                 doubly_stochastic_scale: str = "caption") -> dict[str, torch.Tensor]:
    """Loss of a teacher-forced batch.

    ``logits`` (B, T, V) predict ``targets`` (B, T); positions where ``targets == pad_index`` never count.
    ``cross_entropy`` is the mean negative log-likelihood of the real words (what is reported); the
    optimised word term mixes it with the mean over the vocabulary of ``-log p`` by ``label_smoothing``.
    ``attention`` is the doubly stochastic term.
    """
    mask = targets != pad_index
    words = mask.sum()
    # every position through log_softmax, padding then given no weight: cheaper than copying the real
    # rows out of (B, T, V) and scattering their gradient back
    log_probs = F.log_softmax(logits.float(), dim=-1)                          # (B, T, V)
    nll = -log_probs.gather(2, targets.unsqueeze(-1)).squeeze(-1)               # (B, T)
    cross_entropy = torch.where(mask, nll, 0.0).sum() / words
    word_loss = cross_entropy
    if label_smoothing > 0:
        uniform = -torch.where(mask, log_probs.mean(dim=-1), 0.0).sum() / words
        word_loss = (1 - label_smoothing) * cross_entropy + label_smoothing * uniform
    out = {"cross_entropy": cross_entropy, "words": words}
    if alpha is not None and doubly_stochastic > 0:
        out["attention"] = doubly_stochastic_term(alpha, mask, doubly_stochastic, doubly_stochastic_scale)
        out["loss"] = word_loss + out["attention"]
    else:
        out["loss"] = word_loss
    return out


def hard_attention_loss(out: dict[str, torch.Tensor], targets: torch.Tensor, baseline: torch.Tensor,
                        baseline_updates: torch.Tensor, *, doubly_stochastic: float, entropy_weight: float,
                        baseline_decay: float = 0.9, reward_kind: str = "sequence", pad_index: int = 0,
                        doubly_stochastic_scale: str = "caption") -> dict[str, torch.Tensor]:
    """Surrogate loss whose gradient is the paper's estimator of ``-dL_s/dW`` (eq. 11-13).

    For each caption with sampled locations ``s`` (rows not in ``out["expectation_rows"]``):

        grad = d log p(y|s,a)/dW + (log p(y|s,a) - b) * d log p(s|a)/dW + entropy_weight * dH[s]/dW

    The first term reaches every weight through the likelihood; the second (REINFORCE, the reward
    ``log p(y|s,a)`` detached, minus the baseline ``b``) reaches the attention network and everything
    that shapes ``alpha``. Rows that used the expected location get the plain likelihood gradient (which
    then also flows through ``alpha``). All terms are divided by the number of real words, as the
    cross-entropy of soft attention is. ``baseline`` and ``baseline_updates`` are the decoder's buffers,
    updated in place after use: ``b <- decay * b + (1 - decay) * mean reward`` (the first batch sets ``b``
    before its use, so it starts at the reward's scale, not at 0).
    ``out`` is the decoder's training output; ``targets`` (B, T) are repeated to match it when the decoder
    drew several location samples per caption.

    ``reward_kind="sequence"`` is the paper's reward, the caption's log-likelihood; ``"per_word"`` divides it by
    the caption's length, so that long captions (lower log-likelihood whatever the locations) do not
    read as bad locations: the same estimator up to a per-caption positive scale, with less variance
    when caption lengths vary.
    """
    repeats = out.get("repeats", 1)
    if repeats > 1:
        targets = targets.repeat_interleave(repeats, 0)
    mask = targets != pad_index
    words = mask.sum()
    logits = out["logits"].float()
    token_log_probs = -F.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * mask   # (B, T)
    log_likelihood = token_log_probs.sum(dim=1)                                                      # (B,)
    cross_entropy = -log_likelihood.sum() / words
    sampled = (~out["expectation_rows"]).float()
    if reward_kind not in ("sequence", "per_word"):
        raise ValueError(f"model.hard_reward must be sequence or per_word, not {reward_kind!r}")
    reward = log_likelihood.detach() / (mask.sum(dim=1).clamp_min(1) if reward_kind == "per_word" else 1)
    if baseline_updates == 0 and sampled.any():
        with torch.no_grad():
            baseline.copy_(reward[sampled.bool()].mean())  # the first batch sets b instead of comparing with 0
    advantage = (reward - baseline) * sampled
    location_log_prob = (out["log_prob_location"].float() * mask).sum(dim=1)
    reinforce = -(advantage * location_log_prob).sum() / words
    entropy = (out["entropy"].float() * mask).sum() / words
    loss = cross_entropy + reinforce - entropy_weight * entropy
    result = {"cross_entropy": cross_entropy, "words": words, "reinforce": reinforce, "entropy": entropy,
              "reward": reward.mean(), "baseline": baseline.detach().clone()}
    if doubly_stochastic > 0:
        result["attention"] = doubly_stochastic_term(out["alpha"], mask, doubly_stochastic, doubly_stochastic_scale)
        loss = loss + result["attention"]
    result["loss"] = loss
    if sampled.any():
        with torch.no_grad():
            baseline.mul_(baseline_decay).add_((1 - baseline_decay) * reward[sampled.bool()].mean())
            baseline_updates.add_(1)
    return result


def decoder_loss(decoder, out: dict[str, torch.Tensor], targets: torch.Tensor, config: dict) -> dict[str, torch.Tensor]:
    """The training loss for ``decoder``'s teacher-forced output ``out`` under the resolved ``config``:
    the REINFORCE surrogate for hard attention, else the (label-smoothed) cross-entropy."""
    model_config = config["model"]
    if "log_prob_location" in out:
        return hard_attention_loss(out, targets, decoder.reward_baseline, decoder.baseline_updates,
                                   doubly_stochastic=model_config["doubly_stochastic"],
                                   entropy_weight=model_config["entropy_weight"],
                                   baseline_decay=model_config["baseline_decay"], reward_kind=model_config["hard_reward"],
                                   doubly_stochastic_scale=model_config["doubly_stochastic_scale"])
    return caption_loss(out["logits"], targets, out.get("alpha"), model_config["doubly_stochastic"],
                        label_smoothing=config["train"]["label_smoothing"],
                        doubly_stochastic_scale=model_config["doubly_stochastic_scale"])
