"""`captioner export`: a checkpoint as an inference package (safetensors, config.json, vocab.json, model card, ONNX
graphs) that every command and the Predictor take, whose captions equal the checkpoint's."""

import json
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from captioner import Predictor
from captioner.checkpoint import load_checkpoint
from captioner.cli import main
from captioner.core.files import UMASK
from captioner.errors import CaptionerError
from captioner.export.folder import FORMAT_VERSION
from captioner.serve.checkpoints import load_served_models
from captioner.training.engine import train
from captioner.version import __version__
from captioner.workflows.evaluate import evaluate_checkpoint
from captioner.workflows.export import export_checkpoint
from tests.conftest import tiny_config

onnxruntime = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def images(tiny_coco):
    return sorted((tiny_coco / "images").rglob("*.png"))


@pytest.fixture(scope="module")
def exports(served_checkpoints, tmp_path_factory):
    """The soft, hard and Transformer checkpoints exported (float32) with their ONNX graphs, through the command."""
    root = tmp_path_factory.mktemp("exports")
    for name in ("soft", "hard", "transformer"):
        assert main(["export", "--checkpoint", served_checkpoints[name], "--out", str(root / name), "--onnx"]) == 0
    return {name: root / name for name in ("soft", "hard", "transformer")}


def assert_same_captions(expected, got, log_prob_tolerance: float, alpha_tolerance: float):
    assert [r.caption for r in got] == [r.caption for r in expected]
    for a, b in zip(expected, got):
        assert abs(a.log_prob - b.log_prob) <= log_prob_tolerance
        assert [beam.caption for beam in a.beams] == [beam.caption for beam in b.beams]
        assert a.attention.keys() == b.attention.keys()
        for name in a.attention:
            torch.testing.assert_close(b.attention[name], a.attention[name], rtol=0, atol=alpha_tolerance)


@pytest.mark.parametrize("name", ["soft", "hard", "transformer"])
@pytest.mark.parametrize("beam", [1, 3])
def test_an_export_captions_as_its_checkpoint_in_torch_and_in_onnx_runtime(served_checkpoints, exports, images, name,
                                                                           beam):
    expected = Predictor.load(served_checkpoints[name], beam=beam, n_best=beam).caption(images)
    exported = Predictor.load(exports[name], beam=beam, n_best=beam).caption(images)
    assert_same_captions(expected, exported, 0.0, 0.0)          # float32: the very same weights, the same numbers
    onnx = Predictor.load(exports[name], beam=beam, n_best=beam, runtime="onnx")
    assert type(onnx.model.decoder).__name__ == "OnnxDecoder" and type(onnx.model.encoder).__name__ == "OnnxEncoder"
    assert_same_captions(expected, onnx.caption(images), 1e-4, 1e-5)


def onnx_greedy(folder, image: np.ndarray, start: int, end: int, max_words: int) -> list[int]:
    """Greedy decoding of one image with ONNX Runtime alone, following config.json's onnx block and the export
    format's rules (docs/reference/export-format.md) as another runtime would (no captioner code): never <pad> (index 0) or <start>."""
    graphs = json.loads((folder / "config.json").read_text())["onnx"]
    encoder, init, step = (onnxruntime.InferenceSession(str(folder / graphs[k])) for k in
                           ("encoder", "decoder_init", "decoder_step"))
    (regions,) = encoder.run(["regions"], {"images": image[None]})
    state = dict(zip(graphs["state"], init.run([f"state.{n}" for n in graphs["state"]], {"regions": regions})))
    outputs = ["log_probs", *(f"next.{n}" for n in graphs["changing"])]
    words, token = [], start
    for _ in range(max_words):
        feeds = {"tokens": np.array([token], dtype=np.int64), **{f"state.{n}": v for n, v in state.items()}}
        log_probs, *changed = step.run(outputs, feeds)
        state.update(zip(graphs["changing"], changed))
        log_probs[0, [0, start]] = -np.inf
        token = int(log_probs[0].argmax())
        if token == end:
            break
        words.append(token)
    return words


@pytest.mark.parametrize("name", ["soft", "transformer"])
def test_the_onnx_graphs_decode_by_their_documented_contract_alone(exports, images, name):
    predictor = Predictor.load(exports[name], beam=1, overrides=["decode.suppress_unk=false"])
    for path in images[:4]:
        (result,) = predictor.caption([path])
        pixels = predictor.transform(Image.open(path).convert("RGB")).numpy()
        vocab = predictor.vocab
        words = onnx_greedy(exports[name], pixels, vocab.start_index, vocab.end_index, predictor.decode_config.max_length)
        assert [vocab.words[i] for i in words] == result.words


def test_the_weights_are_safetensors_tied_weights_stored_once(served_checkpoints, exports):
    from safetensors import safe_open

    for name, folder in exports.items():
        described = json.loads((folder / "config.json").read_text())
        assert described["format_version"] == FORMAT_VERSION and described["captioner_version"] == __version__
        assert described["trained_with"] == load_checkpoint(served_checkpoints[name])["captioner_version"] == __version__
        assert described["regions"] == {"image_size": [32, 32], "grid": [2, 2], "feature_dim": 96}
        for path in folder.iterdir():        # readable by others, as files made with open() are
            assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~UMASK, path
        assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~UMASK
        assert described["weights"]["dtype"] == "float32" and described["encoder"]["weights"] is None
        state = load_checkpoint(served_checkpoints[name])["model"]
        with safe_open(str(folder / "model.safetensors"), "pt") as weights:
            stored = set(weights.keys())
            assert stored | set(described["weights"]["tied"]) == set(state)
            for key in stored:
                assert torch.equal(weights.get_tensor(key), state[key])
        assert (name == "transformer") == bool(described["weights"]["tied"])      # its output layer is its embedding
        assert json.loads((folder / "vocab.json").read_text()) == load_checkpoint(served_checkpoints[name])["vocab"]


# The tolerance (measured on the demo's trained models, 300 test images, scripts/export_fidelity.py): float16
# keeps at least 97 % of the captions, the others' log-probabilities within 0.005 in the median; bfloat16 at least
# 66 %, within 0.05.
@pytest.mark.parametrize("dtype, same, tolerance", [("float16", 0.95, 5e-3), ("bfloat16", 0.6, 5e-2)])
def test_half_precision_exports_halve_the_weights_and_caption_within_tolerance(served_checkpoints, exports, images,
                                                                               tmp_path, dtype, same, tolerance):
    folder = tmp_path / dtype
    export_checkpoint(served_checkpoints["soft"], folder, dtype=dtype)
    full = (exports["soft"] / "model.safetensors").stat().st_size
    assert (folder / "model.safetensors").stat().st_size < 0.55 * full
    expected = Predictor.load(served_checkpoints["soft"], beam=3).caption(images)
    got = Predictor.load(folder, beam=3).caption(images)
    kept = [abs(a.log_prob - b.log_prob) for a, b in zip(expected, got) if a.caption == b.caption]
    assert len(kept) >= same * len(images) and np.median(kept) <= tolerance
    assert 0 < np.median(kept)          # the weights were rounded: not the float32 export under another name


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("captioner: error: "), err
    return err


def test_a_changed_damaged_or_foreign_export_is_one_line(exports, images, tmp_path, capsys):
    def broken(change, *options):
        folder = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(exports["soft"], folder)
        change(folder)
        assert main(["caption", str(images[0]), "--checkpoint", str(folder), *options]) == 1
        return one_line_error(capsys)

    def flip_a_byte(folder):
        data = bytearray((folder / "model.safetensors").read_bytes())
        data[-3] ^= 0x40
        (folder / "model.safetensors").write_bytes(bytes(data))

    def rewrite_config(**changes):
        def change(folder):
            described = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**described, **changes}))
        return change

    assert "model.safetensors: damaged or changed" in broken(flip_a_byte)
    assert "in a newer format" in broken(rewrite_config(format_version=FORMAT_VERSION + 1))
    assert "not the config.json of a captioner export" in broken(rewrite_config(format="other"))
    assert "model.safetensors: missing" in broken(lambda folder: (folder / "model.safetensors").unlink())
    assert "vocab.json: not the vocabulary of" in broken(lambda folder: (folder / "vocab.json").write_text('{"words": []}'))
    assert "decoder_step.onnx: missing" in broken(lambda folder: (folder / "decoder_step.onnx").unlink(), "--runtime", "onnx")
    (tmp_path / "empty").mkdir()
    assert main(["caption", str(images[0]), "--checkpoint", str(tmp_path / "empty")]) == 1
    assert "neither a checkpoint file nor an exported model" in one_line_error(capsys)


def test_onnx_runtime_needs_an_export_with_graphs(served_checkpoints, exports, images, tmp_path, capsys):
    assert main(["caption", str(images[0]), "--checkpoint", served_checkpoints["soft"], "--runtime", "onnx"]) == 1
    assert "runtime onnx needs an export folder made with --onnx" in one_line_error(capsys)
    export_checkpoint(served_checkpoints["soft"], tmp_path / "plain")
    assert main(["caption", str(images[0]), "--checkpoint", str(tmp_path / "plain"), "--runtime", "onnx"]) == 1
    assert "exported without ONNX graphs" in one_line_error(capsys)
    assert main(["caption", str(images[0]), "--checkpoint", str(exports["soft"]), "--runtime", "onnx",
                 "model.lstm.hidden_dim=8"]) == 1
    assert "fixed at export" in one_line_error(capsys)


def test_export_never_replaces_other_files_and_a_failed_export_leaves_nothing(served_checkpoints, tmp_path, capsys,
                                                                                monkeypatch):
    checkpoint = served_checkpoints["soft"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["export", "--checkpoint", checkpoint, "--out", str(tmp_path / "mine"), "--overwrite"]) == 1
    assert "a folder of other files" in one_line_error(capsys)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    out = tmp_path / "model"
    assert main(["export", "--checkpoint", checkpoint, "--out", str(out)]) == 0
    before = (out / "config.json").read_bytes()
    assert main(["export", "--checkpoint", checkpoint, "--out", str(out)]) == 1
    assert "holds an export already (--overwrite replaces it)" in one_line_error(capsys)

    def fail(model, folder):
        raise CaptionerError("encoder.onnx: ONNX export failed (on purpose)")

    monkeypatch.setattr("captioner.export.onnx.export_onnx", fail)
    assert main(["export", "--checkpoint", checkpoint, "--out", str(out), "--overwrite", "--onnx"]) == 1
    assert "on purpose" in one_line_error(capsys)
    assert (out / "config.json").read_bytes() == before and not (out / "encoder.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "model"]      # no partial folder left behind
    assert main(["export", "--checkpoint", str(out), "--out", str(tmp_path / "again")]) == 1
    assert "is an export already" in one_line_error(capsys)


@pytest.fixture(scope="module")
def evaluated_run(tiny_coco, tmp_path_factory):
    """A run of its own (its folder gets scores written into it), evaluated on test, then exported."""
    root = tmp_path_factory.mktemp("carded")
    result = train(tiny_config(tiny_coco, root / "run", train={"epochs": 1}), progress=False)
    scores = evaluate_checkpoint(result["checkpoint"], "test", progress=False)
    export_checkpoint(result["checkpoint"], root / "shared-model", overrides=["decode.beam=2"])
    return Path(result["checkpoint"]), root / "shared-model", scores


def test_the_model_card_tells_what_the_model_is_how_it_was_trained_and_how_it_scored(evaluated_run):
    checkpoint, folder, scores = evaluated_run
    card = (folder / "README.md").read_text()
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    metadata = yaml.safe_load(front)
    assert metadata["library_name"] == "captioner" and metadata["pipeline_tag"] == "image-to-text"
    assert "soft-attention" in metadata["tags"]
    progress = load_checkpoint(checkpoint)["progress"]
    assert progress["train_images"] == 12 and progress["train_captions"] == 24
    assert "12 images, 24 captions" in body and "an LSTM decoder with soft attention" in body
    assert f"| test | 6 | {scores['beam']} | {scores['BLEU-1']:.3f} |" in body and f"{scores['CIDEr']:.3f}" in body
    assert 'Predictor.load("shared-model")' in body and "huggingface-cli upload USER/shared-model shared-model" in body
    assert "Decoding defaults (`decode`): beam 2" in body          # the export's overrides are what it keeps
    assert json.loads((folder / "config.json").read_text())["decode"]["beam"] == 2
    for name in ("model.safetensors", "config.json", "vocab.json"):
        assert f"| `{name}` | {(folder / name).stat().st_size:,} |" in body


def test_the_card_leaves_out_scores_of_another_checkpoint(evaluated_run, tmp_path):
    checkpoint, _, _ = evaluated_run
    run = tmp_path / "run"
    shutil.copytree(checkpoint.parent, run)
    scores = json.loads((run / "scores_test.json").read_text())
    (run / "scores_test.json").write_text(json.dumps({**scores, "checkpoint_sha256": ["0" * 64]}))
    export_checkpoint(run / "best.pt", tmp_path / "export")
    body = (tmp_path / "export" / "README.md").read_text()
    assert "No `captioner evaluate` scores of this checkpoint were found" in body and "| test |" not in body


def test_the_export_carries_the_data_the_model_was_trained_on(evaluated_run, shapes_checkpoint, tmp_path, capsys):
    _, photos, _ = evaluated_run
    assert json.loads((photos / "config.json").read_text())["trained_on"] == {"name": None, "kind": "photos"}
    assert main(["export", "--checkpoint", str(shapes_checkpoint), "--out", str(tmp_path / "shapes")]) == 0
    described = json.loads((tmp_path / "shapes" / "config.json").read_text())
    assert described["trained_on"] == {"name": "shapes", "kind": "synthetic shapes"}
    card = (tmp_path / "shapes" / "README.md").read_text()
    assert "license: mit" in card and "Data: captioner's synthetic shapes" in card
    assert "knows nothing of photographs" in card
    assert "captioner serve --checkpoint shapes" in card
    assert Predictor.load(tmp_path / "shapes").trained_on == described["trained_on"]
    image = tmp_path / "photo.png"
    Image.new("RGB", (32, 32), "green").save(image)
    capsys.readouterr()
    assert main(["caption", str(image), "--checkpoint", str(tmp_path / "shapes")]) == 0
    assert capsys.readouterr().err.startswith("captioner: warning: this model was trained on the synthetic shapes")


def test_every_command_takes_an_export_folder(evaluated_run, tiny_coco, tmp_path, capsys):
    checkpoint, folder, scores = evaluated_run
    again = evaluate_checkpoint(folder, "test", progress=False, beam=scores["beam"])
    assert {k: again[k] for k in ("BLEU-4", "CIDEr", "images")} == {k: scores[k] for k in ("BLEU-4", "CIDEr", "images")}
    assert (folder / "scores_test.json").exists()        # written into the export, which is its own folder
    image = next((tiny_coco / "images" / "test").glob("*.png"))
    assert main(["attend", str(image), "--checkpoint", str(folder), "--out", str(tmp_path / "figure.png")]) == 0
    assert (tmp_path / "figure.png").stat().st_size > 0
    assert main(["compare", str(folder), str(checkpoint.parent), "--out",
                 str(tmp_path / "report"), "--images", "1"]) == 0
    assert "shared-model" in (tmp_path / "report" / "report.md").read_text()
    served = load_served_models([folder], torch.device("cpu"))
    assert list(served) == ["shared-model"]
    capsys.readouterr()
    start = train(tiny_config(tiny_coco, tmp_path / "tuned", train={"epochs": 1, "init_from": str(folder)}),
                  progress=False)
    assert load_checkpoint(start["checkpoint"])["vocab"] == load_checkpoint(folder)["vocab"]


def test_onnx_export_on_a_torch_too_old_for_it_is_one_line(served_checkpoints, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torch.__version__", "2.10.0+cpu")
    assert main(["export", "--checkpoint", served_checkpoints["soft"], "--out", str(tmp_path / "old"), "--onnx"]) == 1
    assert "ONNX export needs torch 2.11 or newer, this is 2.10.0+cpu" in one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []
