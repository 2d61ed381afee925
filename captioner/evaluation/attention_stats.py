"""How sharp is the attention? Statistics of the per-word maps of decoded captions.

For every generated word's attention map ``alpha`` (L regions, summing to 1):

* ``mean_entropy``: mean of ``-sum_i alpha_i log alpha_i`` (nats); a uniform map has ``log L``
  (``uniform_entropy``), a map on one region 0;
* ``mean_peak``: mean of ``max_i alpha_i``; uniform: ``1 / L``; ``peak_ratio = mean_peak * L`` says how many
  times sharper than uniform the typical peak is;
* ``mean_max_coverage``: per caption, the largest ``sum_t alpha_ti`` over regions (how much of a caption's
  attention the most-looked-at region gets), averaged over captions.

Hard attention is measured on its distribution ``alpha`` (the location it then samples or picks is one-hot).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from captioner.decoding.search import Generation
from captioner.models.attention import attention_entropy


def attention_statistics(generations: Mapping[int, Generation]) -> dict | None:
    """The statistics above over ``{image_id: Generation}``, plus ``words`` measured and ``regions`` L, and
    ``coverage`` (every image-region ``sum_t alpha_ti``, for histograms); None when no map was reported."""
    entropies, peaks, coverage, max_coverage = [], [], [], []
    for generation in generations.values():
        alpha = generation.attention.get("alpha")
        if alpha is None or len(alpha) == 0:
            continue
        alpha = alpha.float()
        entropies.append(attention_entropy(alpha))
        peaks.append(alpha.max(-1).values)
        per_region = alpha.sum(0)
        coverage.append(per_region)
        max_coverage.append(per_region.max())
    if not entropies:
        return None
    regions = coverage[0].numel()
    mean_peak = float(torch.cat(peaks).mean())
    return {"words": int(sum(len(e) for e in entropies)), "regions": regions,
            "mean_entropy": float(torch.cat(entropies).mean()), "uniform_entropy": math.log(regions),
            "mean_peak": mean_peak, "uniform_peak": 1.0 / regions, "peak_ratio": mean_peak * regions,
            "mean_max_coverage": float(torch.stack(max_coverage).mean()),
            "coverage": torch.cat(coverage).tolist()}
