"""The full-Flickr8k recipes stay alive: each trains a few steps on a handful of ../shared/data/flickr8k's photos,
with its own encoder (VGG-19 conv5_4, cached), model, loss and decoding, and its best checkpoint captions photos;
each recipe's no-attention ablation resolves. Skipped where the photos are not (they are research-use only)."""

import json
from pathlib import Path

import pytest

from captioner.config import load_config, recipes
from captioner.predictor import Predictor
from captioner.training.engine import train
from captioner.training.features import cache_features

FLICKR8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "flickr8k"
RECIPES = ("flickr8k_full_soft", "flickr8k_full_hard", "flickr8k_full_transformer")
ABLATIONS = {"flickr8k_full_soft": ["model.lstm.attention=none"],
             "flickr8k_full_hard": ["model.lstm.attention=none", "model.lstm.attention_mode=soft"],
             "flickr8k_full_transformer": ["model.transformer.memory=mean"]}

pytestmark = pytest.mark.skipif(not FLICKR8K.exists(), reason="../shared/data/flickr8k is not here")


@pytest.fixture(scope="module")
def handful(tmp_path_factory):
    """The first 6 train and 3 val photos of the recipes' split file, with their features cached as the recipes
    cache them: ``(overrides pointing a recipe at them, folder, the val photos' paths)``."""
    folder = tmp_path_factory.mktemp("flickr8k_handful")
    images = json.loads((FLICKR8K / "dataset_flickr8k.json").read_text())["images"]
    picked = [i for i in images if i["split"] == "train"][:6] + [i for i in images if i["split"] == "val"][:3]
    (folder / "dataset_flickr8k.json").write_text(json.dumps({"dataset": "flickr8k", "images": picked}))
    overrides = [f"data.karpathy={folder / 'dataset_flickr8k.json'}", f"data.image_root={FLICKR8K}",
                 f"data.features={folder / 'features'}", "data.vocab_min_count=1"]
    cache_features(load_config(recipes()["flickr8k_full_soft"], overrides), ["train", "val"], progress=False)
    return overrides, folder, [FLICKR8K / i["filepath"] / i["filename"] for i in picked[6:]]


@pytest.mark.parametrize("recipe", RECIPES)
def test_full_recipe_trains_a_few_steps_and_its_checkpoint_decodes(recipe, handful):
    overrides, folder, photos = handful
    config = load_config(recipes()[recipe], [*overrides, f"run.out={folder / recipe}", "train.epochs=1",
                                             "train.batch_size=10", "train.val_max_images=3"])
    assert config.data.features == str(folder / "features") and config.encoder.name == "vgg19"
    result = train(config, progress=False)
    assert result["step"] == 3 and result["epochs"] == 1              # 30 captions of 6 photos, 10 a step
    captions = Predictor.load(result["checkpoint"]).caption(photos)      # from the photos, through VGG-19
    assert all(c.error is None and c.caption for c in captions)


@pytest.mark.parametrize("recipe", RECIPES)
def test_full_recipe_and_its_no_attention_ablation_resolve(recipe):
    config = load_config(recipes()[recipe])
    assert config.data.karpathy.endswith("flickr8k/dataset_flickr8k.json") and config.train.amp == "auto"
    assert config.train.val_max_images < 1000 and config.train.metric == "CIDEr"
    ablation = load_config(recipes()[recipe], ABLATIONS[recipe])
    assert (ablation.model.lstm.attention == "none" if ablation.model.decoder == "lstm"
            else ablation.model.transformer.memory == "mean")
