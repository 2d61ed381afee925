"""An ensemble of decoders that share a vocabulary, searched like one decoder.

:class:`EnsembleDecoder` keeps the decode-step interface of :mod:`captioner.models.decoder`: its state holds
every member's state under the member's number (``"0.h"``, ``"1.cross_k0"``, ...), its ``fixed_state`` is the
members' fixed states, and each step averages the members' word probabilities (the log of the mean
probability, so the result is again a distribution). The attention maps it reports are the first member's.
Any mix of decoders works (LSTM soft or hard, Transformer); they read the same regions, so the members must
come from checkpoints with the same encoder (:func:`ensemble_of`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from captioner.errors import CaptionerError

ENCODER_KEYS = ("name", "image_size", "stride", "grid")


class EnsembleDecoder(nn.Module):
    """The members' averaged word distribution at each step; the first member's attention."""

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(members)

    @property
    def fixed_state(self) -> tuple[str, ...]:
        return tuple(f"{i}.{name}" for i, member in enumerate(self.members) for name in getattr(member, "fixed_state", ()))

    def init_state(self, regions: torch.Tensor) -> dict[str, torch.Tensor]:
        return {f"{i}.{name}": value for i, member in enumerate(self.members)
                for name, value in member.init_state(regions).items()}

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor]):
        log_probs, new_state, attention = [], {}, {}
        for i, member in enumerate(self.members):
            prefix = f"{i}."
            own = {name[len(prefix):]: value for name, value in state.items() if name.startswith(prefix)}
            member_log_probs, own, member_attention = member.step(tokens, own)
            log_probs.append(member_log_probs)
            new_state.update({prefix + name: value for name, value in own.items()})
            attention = attention or member_attention
        mean = torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(log_probs))
        return mean, new_state, attention


def ensemble_of(models: Sequence[nn.Module], vocabs: Sequence, configs: Sequence, names: Sequence[str]):
    """``(decoder, vocab)`` for decoding with the loaded checkpoints ``models`` together: the single decoder for
    one model, else an :class:`EnsembleDecoder`. Refuses checkpoints of different vocabularies or encoders,
    naming the checkpoint (``names``) at fault."""
    first_vocab, first_encoder = vocabs[0], {k: getattr(configs[0].encoder, k) for k in ENCODER_KEYS}
    for vocab, config, name in zip(vocabs[1:], configs[1:], names[1:]):
        if vocab != first_vocab:
            raise CaptionerError(f"{name}: its vocabulary ({len(vocab)} words) differs from {names[0]}'s "
                                 f"({len(first_vocab)} words); an ensemble needs one vocabulary")
        encoder = {k: getattr(config.encoder, k) for k in ENCODER_KEYS}
        if encoder != first_encoder:
            raise CaptionerError(f"{name}: its encoder {encoder} differs from {names[0]}'s {first_encoder}; "
                                 "ensemble members read the same regions")
    decoders = [model.decoder for model in models]
    return (decoders[0] if len(decoders) == 1 else EnsembleDecoder(decoders)), first_vocab
