"""An exponential moving average of a model's trained weights (``train.ema_decay``): the model that validation
scores, that ``best.pt`` keeps and that decoding uses, while the optimizer steps the weights themselves.

After update ``n`` the average is ``avg = d_n * avg + (1 - d_n) * w`` with ``d_n = min(d, (1 + n) / (10 + n))``:
the short decay of the first updates keeps the random start from weighing on it for thousands of steps."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


class WeightAverage:
    """The moving average of ``model``'s trainable parameters (frozen ones never change: they are their own
    average). ``updates`` counts the updates since the average was last set to the weights."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.params = [p for p in model.parameters() if p.requires_grad]   # each shared parameter once
        self.average = [p.detach().clone() for p in self.params]
        self.updates = 0

    @torch.no_grad()
    def reset(self, updates: int = 0) -> None:
        """Set the average to the weights as they are (after loading other weights into the model), as after
        ``updates`` updates."""
        torch._foreach_copy_(self.average, [p.detach() for p in self.params])
        self.updates = updates

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average towards the current weights."""
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1.0 - decay)

    @contextmanager
    def applied(self):
        """Within the block the model holds the averaged weights; its own weights come back after."""
        with torch.no_grad():
            weights = [p.detach().clone() for p in self.params]
            torch._foreach_copy_([p.data for p in self.params], self.average)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.data for p in self.params], weights)
