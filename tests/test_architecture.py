"""The recipe of docs/architecture.md, followed by a test: a new decoder added through those steps only
trains, decodes with the one beam search, is evaluated and shows up in the configuration reference."""

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from captioner.checkpoint import load_model
from captioner import config as config_module
from captioner.config import config_reference, load_config
from captioner.decoding.search import TokenRules, beam_search, greedy
from captioner.errors import CaptionerError
from captioner.commands.evaluate import evaluate_checkpoint
from captioner.models import captioner as registry
from captioner.models.decoder import CaptionDecoder, TeacherForced
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.models.transformer_decoder import TransformerDecoder, TransformerDecoderConfig
from captioner.settings import setting, settings_of
from captioner.training.engine import train
from tests.conftest import tiny_config


@dataclass
class GatedBagConfig:
    """Step 1: the config dataclass. The three data fields (filled when the model is built) have plain defaults;
    every setting is declared with setting(): its default, its meaning, its bounds; check() holds the settings
    that depend on one another."""

    vocab_size: int = 0
    region_dim: int = 0
    grid: tuple[int, int] = (0, 0)
    hidden: int = setting(16, "size of the word state", minimum=1)
    temperature: float = setting(1.0, "divides the attention scores", above=0)

    def check(self) -> None:
        pass


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
    # Step 3: register it (the built-in decoders are registered the same way in captioner.models.captioner).
    monkeypatch.setitem(registry.DECODERS, "bag", None)          # taken out of the registry again after the test
    registry.register_decoder("bag", GatedBagDecoder, GatedBagConfig, label="bag of regions")
    assert "| `model.bag.hidden` | `16` | whole number, >= 1 | size of the word state |" in config_reference()
    assert load_config(None, ["model.decoder=bag", "model.bag.hidden=8"]).model.bag.hidden == 8
    with pytest.raises(CaptionerError, match="^override 'model.bag.temperature=0': model.bag.temperature must be "
                                             "above 0, got 0$"):
        load_config(None, ["model.decoder=bag", "model.bag.temperature=0"])

    config = tiny_config(tiny_coco, tmp_path / "bag", model={"decoder": "bag", "bag": {"hidden": 12}},
                         loss={"doubly_stochastic": 0.0}, train={"epochs": 2, "lr": 0.01})
    result = train(config)
    model, vocab, _, _ = load_model(result["checkpoint"])
    assert isinstance(model.decoder, GatedBagDecoder) and model.decoder.config.hidden == 12

    features = model.encoder(torch.rand(3, 3, 32, 32))
    indices = {"rules": TokenRules(vocab.start_index, vocab.end_index), "max_length": 6}
    single = beam_search(model.decoder, features, beam=1, **indices)
    assert [g.tokens for g in single] == [g.tokens for g in greedy(model.decoder, features, **indices)]
    for generation in beam_search(model.decoder, features, beam=3, **indices):
        if generation.tokens:
            torch.testing.assert_close(generation.attention["alpha"].sum(-1), torch.ones(len(generation.tokens)))

    scores = evaluate_checkpoint(result["checkpoint"], "test", out_dir=tmp_path / "eval", progress=False)
    assert scores["images"] == 6 and "CIDEr" in scores and scores["attention"]["regions"] == 4


# The layers of the package, lowest first: a module may import its own layer and those below, never one above.
LAYERS = (
    ("leaves", ("captioner.errors", "captioner.utils", "captioner.settings", "captioner.tokens", "captioner.version")),
    ("data", ("captioner.data",)),
    ("models and decoding", ("captioner.models", "captioner.decoding")),
    ("config and checkpoints", ("captioner.config", "captioner.checkpoint", "captioner.export.folder")),
    ("training, evaluation, drawing, exporting", ("captioner.training", "captioner.evaluation", "captioner.visualisation",
                                                  "captioner.feature_extraction", "captioner.export")),
    ("the predictor", ("captioner.predictor",)),
    ("commands", ("captioner.commands.evaluate", "captioner.commands.report", "captioner.commands.demo_job", "captioner.serve",
                  "captioner.cli", "captioner.__main__", "captioner")),
)


def layer_of(module: str) -> int:
    """The layer of ``module``: that of the longest prefix named in :data:`LAYERS`."""
    best, depth = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    assert best is not None, f"{module} is in no layer of LAYERS"
    return best


PACKAGE = Path(__file__).resolve().parent.parent / "captioner"


def package_imports(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` of every module of ``package``: module-level imports and those inside
    functions alike; only imports under ``if TYPE_CHECKING:`` (annotations, never run) are left out."""
    modules = {".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package.rglob("*.py")}
    typing_only = set()
    imports = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                typing_only |= {id(child) for stmt in node.body for child in ast.walk(stmt)}
        found = {}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module:
                for target in (node.module, *(f"{node.module}.{a.name}" for a in node.names)):
                    if target in modules and target != name:
                        found.setdefault(target, node.lineno)
            elif isinstance(node, ast.Import):
                found |= {a.name: node.lineno for a in node.names if a.name in modules and a.name != name}
        imports[name] = found
    return imports


def test_imports_run_down_the_layers_and_never_in_a_cycle():
    imports = package_imports()
    upward = [f"{name}:{line} imports {target} ({LAYERS[layer_of(target)][0]} above {LAYERS[layer_of(name)][0]})"
              for name, targets in imports.items() for target, line in targets.items()
              if layer_of(target) > layer_of(name)]
    assert not upward, "\n".join(upward)

    def visit(name: str, path: list[str]) -> None:
        for target in imports[name]:
            assert target not in path, f"import cycle: {' -> '.join(path[path.index(target):] + [target])}"
            visit(target, path + [target])

    for name in imports:
        visit(name, [name])


def test_the_layer_test_sees_an_import_inside_a_function_and_skips_annotations(tmp_path):
    package = tmp_path / "captioner"
    (package / "models").mkdir(parents=True)
    (package / "predictor.py").write_text("")
    (package / "config.py").write_text("")
    (package / "models" / "probe.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from captioner.config import Config\n\n\n"
        "def probe():\n    from captioner.predictor import Predictor\n    return Predictor\n")
    assert package_imports(package)["captioner.models.probe"] == {"captioner.predictor": 7}
    assert layer_of("captioner.predictor") > layer_of("captioner.models.probe")


REFERENCE = re.compile(r"`~?(captioner(?:\.\w+)+)`")          # `captioner.x.y`, ``captioner.x``, :func:`~captioner.x`
SETTING = re.compile(r"(?<![\w./-])((?:run|data|encoder|model|loss|train|decode)\.[a-z_]+(?:\.[a-z_]+)?)(?![\w/(*-])")
FILE_NAME = (".json", ".yaml", ".py", ".pt", ".png", ".zip", ".txt", ".onnx", ".safetensors")
OLD_LAYOUT = {"train.label_smoothing"}                          # named where translate_legacy reads it


def package_texts() -> list[tuple[str, str]]:
    """``(where, text)`` of every docstring and string literal of the package (f-strings by their literal parts),
    and of docs/architecture.md."""
    texts = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append((str(path.relative_to(PACKAGE.parent)), node.value))
            elif isinstance(node, ast.JoinedStr):
                texts.append((str(path.relative_to(PACKAGE.parent)),
                               "".join(v.value for v in node.values if isinstance(v, ast.Constant))))
    texts.append(("docs/architecture.md", (PACKAGE.parent / "docs" / "architecture.md").read_text()))
    return texts


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module of the package or an attribute of one."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for name in parts[end:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def test_every_name_the_docs_and_docstrings_mention_exists():
    texts = package_texts()
    references = {(where, name) for where, text in texts for name in REFERENCE.findall(text)}
    assert len(references) > 50
    assert [f"{where}: {name}" for where, name in sorted(references) if not resolves(name)] == []
    settings = {f"{section}.{key}" for section, kind in config_module.SECTIONS.items() for key in settings_of(kind)}
    settings |= {f"model.{name}.{key}" for name, entry in registry.DECODERS.items() for key in settings_of(entry.config)}
    sections = {*config_module.SECTIONS, "model", "model.decoder", *(f"model.{name}" for name in registry.DECODERS)}
    mentioned = {(where, name) for where, text in texts for name in SETTING.findall(text)
                 if not name.endswith(FILE_NAME)}
    assert [f"{where}: {name}" for where, name in sorted(mentioned)
            if name not in settings | sections | OLD_LAYOUT] == []
    architecture = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    files = set(re.findall(r"`(captioner/[\w/]+\.py)`", architecture))
    assert files and [f for f in sorted(files) if not (PACKAGE.parent / f).is_file()] == []
    modules = {str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    described = set(re.findall(r"`(captioner/[\w/]+(?:\.py|/))`", architecture))
    undescribed = [m for m in sorted(modules) if m not in described
                   and not any(m.startswith(folder) for folder in described if folder.endswith("/"))]
    assert undescribed == [], "modules docs/architecture.md does not describe"
