"""The Python API, `captioner.Predictor`: the one way every command captions, and what it returns."""

import json

import pytest
import torch
from PIL import Image

from captioner import Predictor
from captioner.checkpoint import load_checkpoint
from captioner.cli import main
from captioner.models import captioner as registry
from captioner.predictor import SHAPES_WARNING


@pytest.fixture(scope="module")
def images(tiny_coco):
    return sorted((tiny_coco / "images" / "test").glob("*.png"))[:5]


@pytest.mark.parametrize("name", ["soft", "hard", "transformer"])
def test_captions_n_best_and_attention_per_word(served_checkpoints, images, name):
    predictor = Predictor.load(served_checkpoints[name], beam=3, n_best=3)
    results = predictor.caption(images)
    assert [r.path for r in results] == images and predictor.grid == (2, 2)
    for result in results:
        assert result.error is None and result.caption == " ".join(result.words)
        assert result.caption == result.beams[0].caption and result.log_prob == result.beams[0].log_prob
        assert len(result.beams) == 3 and [b.log_prob for b in result.beams] == sorted(
            [b.log_prob for b in result.beams], reverse=True)
        alpha = result.attention["alpha"]
        assert alpha.shape == (len(result.words), 2, 2)                # one map per word
        torch.testing.assert_close(alpha.sum((1, 2)), torch.ones(alpha.shape[0]))
        assert ("chosen" in result.attention) == (name == "hard")


def test_batched_equals_one_by_one_and_a_pil_image_equals_its_file(served_checkpoints, images):
    predictor = Predictor.load(served_checkpoints["soft"], beam=2)
    together = predictor.caption(images, batch_size=4)
    for path, result in zip(images, together):
        (alone,) = predictor.caption([path])
        (picture,) = predictor.caption([Image.open(path)])
        assert alone.words == result.words == picture.words
        assert alone.log_prob == pytest.approx(result.log_prob, abs=1e-5)
        torch.testing.assert_close(alone.attention["alpha"], result.attention["alpha"], atol=1e-5, rtol=1e-5)


def test_caption_is_its_three_steps_and_each_can_be_overridden(served_checkpoints, images):
    predictor = Predictor.load(served_checkpoints["soft"], beam=2)
    pixels = torch.stack([predictor.preprocess(path) for path in images[:2]])
    assert pixels.shape == (2, 3, *predictor.image_size) and 0 <= pixels.min() and pixels.max() <= 1
    by_steps = [predictor.postprocess(g, path) for g, path in zip(predictor.forward(pixels, map(str, images[:2])), images)]
    assert [r.caption for r in by_steps] == [r.caption for r in predictor.caption(images[:2])]

    class Shouting(Predictor):
        def postprocess(self, generation, path=None):
            result = super().postprocess(generation, path)
            result.caption = result.caption.upper()
            return result

    shouted = Shouting(predictor.model, predictor.vocab, predictor.config, decode_config=predictor.decode_config)
    assert [r.caption for r in shouted.caption(images[:2])] == [r.caption.upper() for r in by_steps]


def test_an_unreadable_file_is_named_and_the_others_are_captioned(served_checkpoints, images, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    results = Predictor.load(served_checkpoints["soft"]).caption([images[0], broken, images[1]])
    assert [r.error is None for r in results] == [True, False, True] and "broken.png" in results[1].error


def test_the_command_line_captions_through_it(served_checkpoints, images, capsys):
    checkpoint = served_checkpoints["transformer"]
    expected = Predictor.load(checkpoint, beam=2, n_best=2).caption(images[:2])
    assert main(["caption", *map(str, images[:2]), "--checkpoint", checkpoint, "--beam", "2", "--n-best", "2",
                 "--json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["caption"] for p in printed] == [r.caption for r in expected]
    assert [[b["caption"] for b in p["beams"]] for p in printed] == [[b.caption for b in r.beams] for r in expected]


def test_decode_compile_is_honoured_wherever_a_predictor_is_loaded(served_checkpoints, monkeypatch):
    compiled = []
    monkeypatch.setattr("captioner.predictor.compile_decoder", lambda decoder, mode=None, targets=None:
                        compiled.append(targets))
    Predictor.load(served_checkpoints["soft"], overrides=["decode.compile=true"])
    assert compiled == [("step",)]
    Predictor.load(served_checkpoints["soft"])
    assert compiled == [("step",)]


def test_an_ensemble_and_other_settings_share_the_model(served_checkpoints, images):
    ensemble = Predictor.load([served_checkpoints["soft"], served_checkpoints["hard"]], beam=1)
    assert type(ensemble.model.decoder).__name__ == "EnsembleDecoder"
    assert all(r.caption is not None for r in ensemble.caption(images[:2]))
    predictor = Predictor.load(served_checkpoints["soft"], beam=3)
    greedy = predictor.with_decoding(beam=1)
    assert greedy.model is predictor.model and (greedy.decode_config.beam, predictor.decode_config.beam) == (1, 3)
    assert registry.entry_of(predictor.model.decoder).label == "LSTM"


def test_a_checkpoint_records_the_data_it_was_trained_on(shapes_checkpoint, served_checkpoints, tmp_path):
    assert load_checkpoint(shapes_checkpoint)["trained_on"] == {"name": "shapes", "kind": "synthetic shapes"}
    assert load_checkpoint(served_checkpoints["soft"])["trained_on"] == {"name": None, "kind": "photos"}  # COCO format
    assert Predictor.load(shapes_checkpoint).trained_on == {"name": "shapes", "kind": "synthetic shapes"}
    # a checkpoint written before the record: inferred from the data its config names, unknown once they are gone
    payload = load_checkpoint(shapes_checkpoint)
    del payload["trained_on"]
    torch.save(payload, tmp_path / "old.pt")
    assert Predictor.load(tmp_path / "old.pt").trained_on == {"name": "shapes", "kind": "synthetic shapes"}
    elsewhere = json.dumps({"train": str(tmp_path / "gone.json")})
    assert Predictor.load(tmp_path / "old.pt", overrides=[f"data.captions={elsewhere}"]).trained_on is None


def test_a_shapes_model_warns_once_when_given_other_images_than_the_shapes(shapes_checkpoint, served_checkpoints,
                                                                             images, tmp_path, capsys):
    assert main(["caption", *map(str, images[:3]), "--checkpoint", str(shapes_checkpoint)]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 3 and err.splitlines() == [f"captioner: warning: {SHAPES_WARNING}"]
    assert "synthetic shapes" in SHAPES_WARNING and "captioner config --list" in SHAPES_WARNING
    assert "captioner data flickr8k" in SHAPES_WARNING
    figure = tmp_path / "figure.png"
    assert main(["attend", str(images[0]), "--checkpoint", str(shapes_checkpoint), "--out", str(figure)]) == 0
    assert capsys.readouterr().err.count("warning") == 1 and figure.is_file()
    own = sorted((shapes_checkpoint.parent.parent / "data" / "images").rglob("*.png"))[:3]   # the shapes data itself
    assert main(["caption", *map(str, own), "--checkpoint", str(shapes_checkpoint)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["caption", str(images[0]), "--checkpoint", served_checkpoints["soft"]]) == 0   # trained on photos
    assert "warning" not in capsys.readouterr().err


def test_an_image_smaller_than_the_region_grid_is_refused_and_the_others_captioned(served_checkpoints, images,
                                                                                  tmp_path, capsys):
    # the encoder stretches any image to its input: one of 1x1 px would give every region the same colour
    tiny = tmp_path / "pixel.png"
    Image.new("RGB", (1, 1), "red").save(tiny)
    assert main(["caption", str(images[0]), str(tiny), str(images[1]), "--checkpoint", served_checkpoints["soft"]]) == 1
    out, err = capsys.readouterr()
    assert [line.split(":")[0] for line in out.splitlines()] == [str(images[0]), str(images[1])]
    assert err.splitlines() == [f"captioner: error: {tiny}: 1x1 pixels is too small to caption (this model needs at "
                                "least 2x2, a pixel for each region of its 2x2 grid)"]
    smallest = tmp_path / "two.png"
    Image.new("RGB", (2, 2), "red").save(smallest)
    assert Predictor.load(served_checkpoints["soft"]).caption([smallest])[0].error is None
