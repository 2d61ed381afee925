"""The full-Flickr8k recipes stay alive: each trains a few steps on a handful of ../shared/data/flickr8k's photos,
with its own encoder (VGG-19 conv5_4, cached), model, loss and decoding, and its best checkpoint captions photos
(the two SCST recipes: cross-entropy steps, then SCST steps); each recipe's no-attention ablation resolves, and each
recipe that derives from another holds the settings it shares with it. The tests that train are skipped where the
photos are not (they are research-use only); those that read the recipes run everywhere."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from captioner.config import load_config, recipes
from captioner.predictor import Predictor
from captioner.training.engine import train
from captioner.training.features import cache_features

FLICKR8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "flickr8k"
RECIPES = ("flickr8k_full_soft", "flickr8k_full_hard", "flickr8k_full_transformer")
SCST_RECIPES = ("flickr8k_full_soft_scst", "flickr8k_full_transformer_scst")
ABLATIONS = {"flickr8k_full_soft": ["model.lstm.attention=none"],
             "flickr8k_full_hard": ["model.lstm.attention=none", "model.lstm.attention_mode=soft"],
             "flickr8k_full_transformer": ["model.transformer.memory=mean"]}


@pytest.fixture(scope="module")
def handful(tmp_path_factory):
    """The first 6 train and 3 val photos of the recipes' split file, with their features cached as the recipes
    cache them: ``(overrides pointing a recipe at them, folder, the val photos' paths)``; a test that trains on them
    is skipped where the photos are not."""
    if not FLICKR8K.exists():
        pytest.skip("../shared/data/flickr8k is not here")
    folder = tmp_path_factory.mktemp("flickr8k_handful")
    images = json.loads((FLICKR8K / "dataset_flickr8k.json").read_text())["images"]
    picked = [i for i in images if i["split"] == "train"][:6] + [i for i in images if i["split"] == "val"][:3]
    (folder / "dataset_flickr8k.json").write_text(json.dumps({"dataset": "flickr8k", "images": picked}))
    overrides = [f"data.karpathy={folder / 'dataset_flickr8k.json'}", f"data.image_root={FLICKR8K}",
                 f"data.features={folder / 'features'}", "data.vocab_min_count=1"]
    cache_features(load_config(recipes()["flickr8k_full_soft"], overrides), ["train", "val"], progress=False)
    return overrides, folder, [FLICKR8K / i["filepath"] / i["filename"] for i in picked[6:]]


@pytest.mark.parametrize("recipe", [*RECIPES, "flickr8k_full_marginal"])
def test_full_recipe_trains_a_few_steps_and_its_checkpoint_decodes(recipe, handful):
    overrides, folder, photos = handful
    config = load_config(recipes()[recipe], [*overrides, f"run.out={folder / recipe}", "train.epochs=1",
                                             "train.batch_size=10", "train.val_max_images=3"])
    assert config.data.features == str(folder / "features") and config.encoder.name == "vgg19"
    result = train(config, progress=False)
    assert result["step"] == 3 and result["epochs"] == 1              # 30 captions of 6 photos, 10 a step
    captions = Predictor.load(result["checkpoint"]).caption(photos)      # from the photos, through VGG-19
    assert all(c.error is None and c.caption for c in captions)


@pytest.mark.parametrize("recipe", SCST_RECIPES)
def test_full_scst_recipe_trains_cross_entropy_then_self_critical_steps(recipe, handful):
    overrides, folder, photos = handful
    config = load_config(recipes()[recipe], [*overrides, f"run.out={folder / recipe}", "train.epochs=2",
                                             "train.scst_after_epoch=1", "train.batch_size=10",
                                             "train.scst_batch_size=3", "train.val_max_images=3", "train.log_every=1"])
    result = train(config, progress=False)
    assert result["step"] == 3 + 2 and result["epochs"] == 2          # 30 captions / 10; then 6 photos / 3
    steps = [json.loads(line) for line in (folder / recipe / "metrics.jsonl").read_text().splitlines()]
    assert {r["epoch"]: r["objective"] for r in steps if r["type"] == "train"} == {1: "xe", 2: "scst"}
    captions = Predictor.load(result["checkpoint"]).caption(photos)
    assert all(c.error is None and c.caption for c in captions)


@pytest.mark.parametrize("recipe", SCST_RECIPES)
def test_full_scst_recipe_is_its_cross_entropy_recipe_then_scst(recipe):
    config, start = load_config(recipes()[recipe]), load_config(recipes()[recipe.removesuffix("_scst")])
    assert config.train.objective == "scst" and 0 < config.train.scst_after_epoch < config.train.epochs
    assert config.train.scst_lr < config.train.lr and config.train.early_stopping
    for section in ("data", "encoder", "model", "decode"):
        assert getattr(config, section) == getattr(start, section), section
    assert config.loss.label_smoothing == 0                                   # SCST samples from a sharp start
    assert dataclasses.replace(config.loss, label_smoothing=start.loss.label_smoothing) == start.loss
    assert config.train.lr_schedule == start.train.lr_schedule                 # the start's own schedule


@pytest.mark.parametrize("recipe", RECIPES)
def test_full_recipe_and_its_no_attention_ablation_resolve(recipe):
    config = load_config(recipes()[recipe])
    assert config.data.karpathy.endswith("flickr8k/dataset_flickr8k.json") and config.train.amp == "auto"
    assert config.train.val_max_images < 1000 and config.train.metric == "CIDEr"
    ablation = load_config(recipes()[recipe], ABLATIONS[recipe])
    assert (ablation.model.lstm.attention == "none" if ablation.model.decoder == "lstm"
            else ablation.model.transformer.memory == "mean")


def test_marginal_recipe_is_the_soft_recipe_with_marginal_attention():
    marginal, soft = load_config(recipes()["flickr8k_full_marginal"]), load_config(recipes()["flickr8k_full_soft"])
    lstm = marginal.model.lstm
    assert (lstm.attention_mode, lstm.marginal_regions, lstm.marginal_rest) == ("marginal", 4, "soft")
    assert marginal.run.out != soft.run.out
    for section in ("data", "encoder", "decode", "loss", "train"):    # trained as soft is: its schedule, its loss
        assert getattr(marginal, section) == getattr(soft, section), section
    assert dataclasses.replace(lstm, attention_mode="soft", marginal_regions=0, marginal_rest="renormalise") == \
        soft.model.lstm


def test_lite2_scst_recipe_is_the_soft_scst_recipe_with_another_encoder():
    lite2 = load_config(recipes()["flickr8k_full_soft_scst_lite2"])
    vgg = load_config(recipes()["flickr8k_full_soft_scst"])
    assert lite2.encoder.name == "efficientnet_lite2" and lite2.data.features != vgg.data.features
    assert lite2.run.out != vgg.run.out
    for section in ("model", "loss", "train", "decode"):
        assert getattr(lite2, section) == getattr(vgg, section), section
    assert dataclasses.replace(lite2.data, features=vgg.data.features) == vgg.data


def test_lite2_recipe_is_the_cross_entropy_stage_of_the_lite2_scst_recipe():
    xe = load_config(recipes()["flickr8k_full_soft_lite2"])
    scst = load_config(recipes()["flickr8k_full_soft_scst_lite2"])
    assert xe.train.objective == "xe" and xe.train.lr_schedule == "plateau" and xe.train.early_stopping
    assert xe.run.out != scst.run.out and xe.train.epochs == scst.train.scst_after_epoch
    assert dataclasses.replace(xe.run, out=scst.run.out) == scst.run
    for section in ("data", "encoder", "model", "loss", "decode"):
        assert getattr(xe, section) == getattr(scst, section), section
    scst_only = {f.name: getattr(xe.train, f.name) for f in dataclasses.fields(xe.train)
                 if f.name.startswith("scst_") or f.name in ("objective", "epochs")}
    assert dataclasses.replace(scst.train, **scst_only) == xe.train       # the same cross-entropy schedule and stop


def test_lite2_scst_recipe_caches_its_encoders_regions_then_trains_both_stages(handful, tmp_path):
    overrides, _, photos = handful
    overrides = [o for o in overrides if not o.startswith("data.features=")]
    config = load_config(recipes()["flickr8k_full_soft_scst_lite2"], [
        *overrides, f"data.features={tmp_path / 'features'}", f"run.out={tmp_path / 'run'}", "train.epochs=2",
        "train.scst_after_epoch=1", "train.batch_size=10", "train.scst_batch_size=3", "train.val_max_images=3"])
    result = train(config, progress=False)          # caches the Lite2 regions of the 9 photos first
    meta = json.loads((tmp_path / "features" / "meta.json").read_text())
    assert meta["grid"] == [10, 10] and meta["feature_dim"] == 1280 and meta["encoder"]["name"] == "efficientnet_lite2"
    assert result["step"] == 3 + 2 and result["epochs"] == 2
    captions = Predictor.load(result["checkpoint"]).caption(photos)      # from the photos, through Lite2 at 320 px
    assert all(c.error is None and c.caption for c in captions)


def test_lite2_words_recipe_is_the_soft_words_recipe_after_the_lite2_scst_recipe():
    lite2 = load_config(recipes()["flickr8k_full_soft_scst_lite2_words"])
    vgg = load_config(recipes()["flickr8k_full_soft_scst_words"])
    scst = load_config(recipes()["flickr8k_full_soft_scst_lite2"])
    assert lite2.train.init_from == f"{scst.run.out}/best.pt" and lite2.run.out not in (vgg.run.out, scst.run.out)
    assert dataclasses.replace(lite2.train, init_from=vgg.train.init_from) == vgg.train and lite2.loss == vgg.loss
    for section in ("data", "encoder", "model", "decode"):       # the model it fine-tunes, decoded as it was
        assert getattr(lite2, section) == getattr(scst, section), section


WORDS_RECIPES = {  # each recipe after SCST: its cross-entropy recipe and its SCST recipe
    "flickr8k_full_soft_scst_words": ("flickr8k_full_soft", "flickr8k_full_soft_scst"),
    "flickr8k_full_transformer_scst_words": ("flickr8k_full_transformer", "flickr8k_full_transformer_scst")}


@pytest.mark.parametrize("recipe", WORDS_RECIPES)
def test_words_recipe_tunes_the_output_layer_of_its_scst_start_alone(recipe, handful):
    overrides, folder, photos = handful
    cross_entropy, scst = WORDS_RECIPES[recipe]
    start = train(load_config(recipes()[cross_entropy], [
        *overrides, f"run.out={folder / f'{recipe}_start'}", "train.epochs=1", "train.batch_size=10",
        "train.val_max_images=3"]), progress=False)["checkpoint"]
    config = load_config(recipes()[recipe], [
        *overrides, f"run.out={folder / recipe}", f"train.init_from={start}", "train.batch_size=10",
        "train.val_max_images=3"])
    assert load_config(recipes()[recipe]).train.init_from == f"{load_config(recipes()[scst]).run.out}/best.pt"
    result = train(config, progress=False)
    assert result["step"] == 3 and result["epochs"] == 1
    before, after = (torch.load(path, weights_only=True)["model"] for path in (start, result["checkpoint"]))
    assert {k for k in before if not torch.equal(before[k], after[k])} == {"decoder.out_words.weight",
                                                                           "decoder.out_words.bias"}
    captions = Predictor.load(result["checkpoint"]).caption(photos)
    assert all(c.error is None and c.caption for c in captions)
