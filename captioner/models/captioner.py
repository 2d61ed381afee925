"""The captioning model: a CNN encoder (region features) and a decoder (words), built from a config."""

from __future__ import annotations

import torch
from torch import nn

from captioner.errors import CaptionerError
from captioner.models.encoder import Encoder, EncoderConfig, build_encoder
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.models.transformer_decoder import TransformerDecoder, TransformerDecoderConfig


class Captioner(nn.Module):
    """``encoder`` maps images (B, 3, H, W) in [0, 1] to regions (B, L, D); ``decoder`` maps regions to words.

    Training from cached features skips the encoder (``visual`` is already (B, L, D)).
    """

    def __init__(self, encoder: Encoder, decoder: nn.Module):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    @property
    def device(self) -> torch.device:
        return next(self.decoder.parameters()).device

    def features(self, visual: torch.Tensor) -> torch.Tensor:
        """Region features (B, L, D) from images (B, 3, H, W) or cached features (B, L, D)."""
        return self.encoder(visual) if visual.dim() == 4 else visual

    def forward(self, visual: torch.Tensor, captions: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.decoder(self.features(visual), captions)


def build_decoder(model_config: dict, vocab_size: int, feature_dim: int, grid: tuple[int, int]) -> nn.Module:
    """The decoder named by ``model.decoder`` for regions of size ``feature_dim`` on a ``grid``."""
    m = model_config
    if m["decoder"] == "lstm":
        return LSTMDecoder(LSTMDecoderConfig(
            vocab_size=vocab_size, region_dim=feature_dim, grid=tuple(grid), attention=m["attention"],
            score_activation=m["score_activation"],
            attention_dim=m["attention_dim"], embed_dim=m["embed_dim"], hidden_dim=m["hidden_dim"],
            dropout=m["dropout"], gate=m["gate"], learned_sharpness=m["learned_sharpness"], region_position=m["region_position"],
            position_dim=m["position_dim"], attention_mode=m["attention_mode"], hard_decode=m["hard_decode"],
            expectation_probability=m["expectation_probability"], location_samples=m["location_samples"]))
    if m["decoder"] == "transformer":
        if m["attention_mode"] != "soft" or m["attention"] != "additive":
            raise CaptionerError("model.decoder=transformer uses multi-head scaled dot-product attention: "
                                 "leave model.attention and model.attention_mode at their defaults")
        return TransformerDecoder(TransformerDecoderConfig(
            vocab_size=vocab_size, region_dim=feature_dim, grid=tuple(grid), d_model=m["d_model"],
            num_layers=m["num_layers"], num_heads=m["num_heads"], ffn_dim=m["ffn_dim"], dropout=m["dropout"],
            region_position=m["region_position"], tie_embeddings=m["tie_embeddings"],
            attention_layer=m["attention_layer"], max_length=m["max_length"]))
    raise CaptionerError(f"model.decoder must be lstm or transformer, not {m['decoder']!r}")


def build_model(config: dict, vocab_size: int, pretrained: bool | None = None) -> Captioner:
    """Encoder and decoder from a resolved config. ``pretrained=False`` skips loading encoder weights
    (used when a checkpoint's weights are loaded right after)."""
    encoder_config = dict(config["encoder"])
    if pretrained is not None:
        encoder_config["pretrained"] = pretrained and encoder_config["pretrained"]
    encoder = build_encoder(EncoderConfig(**encoder_config))
    decoder = build_decoder(config["model"], vocab_size, encoder.feature_dim, encoder.grid)
    return Captioner(encoder, decoder)
