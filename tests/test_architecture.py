"""The recipe of docs/architecture.md, followed by a test: a new decoder added through those steps only
trains, decodes with the one beam search, is evaluated and shows up in the configuration reference."""

import ast
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from captioner.checkpoint import load_model
from captioner.config import config_reference, load_config
from captioner.decoding.search import TokenRules, beam_search, greedy
from captioner.evaluation.evaluate import evaluate_checkpoint
from captioner.models import captioner as registry
from captioner.models.decoder import CaptionDecoder, TeacherForced
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.models.transformer_decoder import TransformerDecoder, TransformerDecoderConfig
from captioner.training.engine import train
from tests.conftest import tiny_config


@dataclass
class GatedBagConfig:
    """Step 1: the config dataclass; every field but the three data fields has a default and a comment."""

    vocab_size: int
    region_dim: int
    grid: tuple[int, int]
    hidden: int = 16                # size of the word state
    temperature: float = 1.0        # divides the attention scores


class GatedBagDecoder(nn.Module):
    """Step 2: the decoder. The next word depends on the previous word and an attended mean of the regions."""

    fixed_state = ("regions",)
    objective = "likelihood"

    def __init__(self, config: GatedBagConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.hidden)
        self.score = nn.Linear(config.region_dim, config.hidden)
        self.out = nn.Linear(config.region_dim + config.hidden, config.vocab_size)

    def attend(self, regions: torch.Tensor, words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``regions`` (B, L, D), embedded ``words`` (B, T, H) -> logits (B, T, V), alpha (B, T, L)."""
        alpha = torch.softmax(words @ self.score(regions).transpose(1, 2) / self.config.temperature, dim=-1)
        return self.out(torch.cat([alpha @ regions, words], dim=-1)), alpha

    def forward(self, regions: torch.Tensor, captions: torch.Tensor) -> TeacherForced:
        logits, alpha = self.attend(regions, self.embedding(captions[:, :-1]))
        real = captions[:, 1:] != 0                                     # logits at the real positions only
        return TeacherForced(logits=logits[real], alpha=alpha * real.unsqueeze(-1))

    def init_state(self, regions: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"regions": regions}

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor]):
        """N = B * k hypotheses over B images' regions: each image's k rows are k independent positions."""
        regions = state["regions"]
        words = self.embedding(tokens).view(regions.shape[0], -1, self.config.hidden)      # (B, k, H)
        logits, alpha = self.attend(regions, words)
        return torch.log_softmax(logits.flatten(0, 1).float(), dim=-1), state, {"alpha": alpha.flatten(0, 1)}


def test_every_decoder_keeps_the_contract():
    lstm = LSTMDecoder(LSTMDecoderConfig(vocab_size=10, region_dim=4, grid=(2, 2)))
    transformer = TransformerDecoder(TransformerDecoderConfig(vocab_size=10, region_dim=4, grid=(2, 2), d_model=8,
                                                              num_heads=2))
    toy = GatedBagDecoder(GatedBagConfig(vocab_size=10, region_dim=4, grid=(2, 2)))
    assert all(isinstance(d, CaptionDecoder) for d in (lstm, transformer, toy))
    assert not isinstance(nn.Linear(2, 2), CaptionDecoder)


def test_a_decoder_added_by_the_documented_steps_trains_decodes_and_is_evaluated(tiny_coco, tmp_path, monkeypatch):
    # Step 3: register it (a built-in decoder gets its entry in captioner.models.captioner.DECODERS instead).
    monkeypatch.setitem(registry.DECODERS, "bag", registry.DecoderEntry(GatedBagDecoder, GatedBagConfig))
    assert "| `model.bag.hidden` | `16` | size of the word state |" in config_reference()
    assert load_config(None, ["model.decoder=bag", "model.bag.hidden=8"])["model"]["bag"]["hidden"] == 8

    config = tiny_config(tiny_coco, tmp_path / "bag", model={"decoder": "bag", "bag": {"hidden": 12}},
                         loss={"doubly_stochastic": 0.0}, train={"epochs": 2, "lr": 0.01})
    result = train(config)
    model, vocab, _, _ = load_model(result["checkpoint"])
    assert isinstance(model.decoder, GatedBagDecoder) and model.decoder.config.hidden == 12

    features = model.encoder(torch.rand(3, 3, 32, 32))
    indices = {"rules": TokenRules(vocab.start_index, vocab.end_index), "max_length": 6}
    single = beam_search(model.decoder, features, beam_size=1, **indices)
    assert [g.tokens for g in single] == [g.tokens for g in greedy(model.decoder, features, **indices)]
    for generation in beam_search(model.decoder, features, beam_size=3, **indices):
        if generation.tokens:
            torch.testing.assert_close(generation.attention["alpha"].sum(-1), torch.ones(len(generation.tokens)))

    scores = evaluate_checkpoint(result["checkpoint"], "test", out_dir=tmp_path / "eval", progress=False)
    assert scores["images"] == 6 and "CIDEr" in scores and scores["attention"]["regions"] == 4


def test_the_package_has_no_import_cycle():
    package = Path(__file__).resolve().parent.parent / "captioner"
    modules = {".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package.rglob("*.py")}
    imports = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        found = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {m for m in (node.module, *(f"{node.module}.{a.name}" for a in node.names)) if m in modules}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
        imports[name] = found - {name}

    def visit(name: str, path: list[str]) -> None:
        for target in imports[name]:
            assert target not in path, f"import cycle: {' -> '.join(path[path.index(target):] + [target])}"
            visit(target, path + [target])

    for name in modules:
        visit(name, [name])
