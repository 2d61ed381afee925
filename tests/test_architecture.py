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

from captioner import config as config_module
from captioner.checkpoint import load_model
from captioner.config import config_reference, load_config
from captioner.core.settings import setting, settings_of
from captioner.decoding.search import TokenRules, beam_search, greedy
from captioner.errors import CaptionerError
from captioner.models import captioner as registry
from captioner.models.decoder import CaptionDecoder, TeacherForced
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.models.transformer_decoder import TransformerDecoder, TransformerDecoderConfig
from captioner.training.engine import train
from captioner.workflows.evaluate import evaluate_checkpoint
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
    samples_locations = False

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


# The layers of the package, lowest first: a module may import its own layer and those below, never one above; and
# no two of its folders and top-level modules ("units") import each other, not even within a layer.
LAYERS = (
    ("leaves", ("captioner.errors", "captioner.version", "captioner.core")),
    ("kernels", ("captioner.kernels",)),
    ("data", ("captioner.data",)),
    ("models and decoding", ("captioner.models", "captioner.decoding")),
    ("objectives", ("captioner.objectives",)),
    ("exported files", ("captioner.export",)),
    ("config and checkpoints", ("captioner.config", "captioner.checkpoint")),
    ("evaluation and drawing", ("captioner.evaluation", "captioner.visualisation")),
    ("training", ("captioner.training",)),
    ("results and their fingerprints", ("captioner.results",)),
    ("the predictor", ("captioner.predictor",)),
    ("the server", ("captioner.serve",)),
    ("workflows", ("captioner.workflows",)),
    ("commands", ("captioner.commands",)),
    ("the command line and the package", ("captioner.cli", "captioner.__main__", "captioner")),
)


def layer_of(module: str) -> int:
    """The layer of ``module``: that of the longest prefix named in :data:`LAYERS` (``captioner`` itself, the
    package's ``__init__``, names only itself)."""
    best, depth = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or module.startswith(prefix + ".") and prefix != "captioner"
            if inside and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    assert best is not None, f"{module} is in no layer of LAYERS"
    return best


def unit_of(module: str) -> str:
    """The folder or top-level module of the package that ``module`` belongs to: ``captioner.data.text`` ->
    ``captioner.data``."""
    return ".".join(module.split(".")[:2])


ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "captioner"


def package_imports(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` of every module of ``package``: every import, at module level, inside
    functions and under ``if TYPE_CHECKING:`` alike."""
    modules = {".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package.rglob("*.py")}
    imports = {}
    for name, path in modules.items():
        found = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                for target in (node.module, *(f"{node.module}.{a.name}" for a in node.names)):
                    if target in modules and target != name:
                        found.setdefault(target, node.lineno)
            elif isinstance(node, ast.Import):
                found |= {a.name: node.lineno for a in node.names if a.name in modules and a.name != name}
        imports[name] = found
    return imports


def upward_imports(imports: dict[str, dict[str, int]]) -> list[str]:
    """Every import of a module of a higher layer, as ``module:line imports target (its layer above this one)``."""
    return [f"{name}:{line} imports {target} ({LAYERS[layer_of(target)][0]} above {LAYERS[layer_of(name)][0]})"
            for name, targets in imports.items() for target, line in targets.items()
            if layer_of(target) > layer_of(name)]


def unit_graph(imports: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    """The imports between the package's folders and top-level modules: ``{unit: {units it imports}}``."""
    graph: dict[str, set[str]] = {}
    for name, targets in imports.items():
        graph.setdefault(unit_of(name), set()).update(unit_of(t) for t in targets if unit_of(t) != unit_of(name))
    return graph


def find_cycle(graph: dict[str, set[str] | dict]) -> list[str] | None:
    """A cycle of ``graph`` (``{node: nodes it points to}``) as ``[a, b, ..., a]``, or None when it has none."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for target in graph.get(node, ()):
            cycle = visit(target, path + [node])
            if cycle:
                return cycle
        done.add(node)
        return None

    return next((cycle for node in sorted(graph) if (cycle := visit(node, []))), None)


def test_imports_run_down_the_layers_and_never_in_a_cycle():
    imports = package_imports()
    assert not upward_imports(imports), "\n".join(upward_imports(imports))
    assert find_cycle(unit_graph(imports)) is None, f"import cycle between folders: {find_cycle(unit_graph(imports))}"
    assert find_cycle(imports) is None, f"import cycle between files: {find_cycle(imports)}"


def test_only_the_command_line_imports_a_command_and_no_command_another():
    """A command module declares its options and calls the library: only ``captioner.cli`` imports the command
    modules, a command module imports no other one (their shared ``options`` aside), and the scripts, benchmarks,
    tests and notebooks reach the library, not ``captioner.commands``."""
    imports = package_imports()
    commands = {m for m in imports if m.startswith("captioner.commands.") and m != "captioner.commands.options"}
    importers = {name: sorted(commands & set(targets)) for name, targets in imports.items()}
    assert {name for name, found in importers.items() if found} <= {"captioner.cli"}, importers
    outside = [f"{path.relative_to(ROOT)}:{number}" for folder in ("scripts", "benchmarks", "tests", "notebooks")
               for path in sorted((ROOT / folder).rglob("*")) if path.suffix in (".py", ".ipynb")
               and path.name != "test_architecture.py"
               for number, line in enumerate(path.read_text().splitlines(), 1) if "captioner.commands" in line]
    assert outside == []


def test_no_script_or_benchmark_edits_sys_path():
    edits = [f"{path.relative_to(ROOT)}:{number}" for folder in ("scripts", "benchmarks")
             for path in sorted((ROOT / folder).glob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"sys\.path\b", line)]
    assert edits == []


def test_the_layer_test_sees_every_import_and_fails_on_a_cycle_or_an_import_back_up(tmp_path):
    package = tmp_path / "captioner"
    (package / "models").mkdir(parents=True)
    (package / "data").mkdir()
    (package / "predictor.py").write_text("")
    (package / "config.py").write_text("")
    (package / "models" / "probe.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from captioner.config import Config\n\n\n"
        "def probe():\n    from captioner.predictor import Predictor\n    return Predictor\n")
    (package / "models" / "other.py").write_text("from captioner.data import rows\n")
    (package / "data" / "rows.py").write_text("import captioner.models.other\n")
    imports = package_imports(package)
    assert imports["captioner.models.probe"] == {"captioner.config": 3, "captioner.predictor": 7}
    assert upward_imports(imports) == [
        "captioner.models.probe:3 imports captioner.config (config and checkpoints above models and decoding)",
        "captioner.models.probe:7 imports captioner.predictor (the predictor above models and decoding)",
        "captioner.data.rows:1 imports captioner.models.other (models and decoding above data)"]
    assert find_cycle(imports) == ["captioner.data.rows", "captioner.models.other", "captioner.data.rows"]
    assert find_cycle(unit_graph(imports)) == ["captioner.data", "captioner.models", "captioner.data"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def long_functions(package: Path = PACKAGE, limit: int = 60) -> list[str]:
    """``path:line name (N lines)`` of every function (method, nested function) of ``package`` longer than
    ``limit`` lines, from its ``def`` to its last line."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            length = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and length > limit:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_is_over_60_lines(tmp_path):
    assert long_functions() == []
    (tmp_path / "captioner").mkdir()
    (tmp_path / "captioner" / "long.py").write_text("def short():\n    pass\n\n\ndef long():\n" + "    x = 1\n" * 60)
    assert long_functions(tmp_path / "captioner") == ["captioner/long.py:5 long (61 lines)"]


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
