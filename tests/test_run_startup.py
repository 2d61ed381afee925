"""What a training run settles before its first step: the facts it states (device, precision, world, data), a
device that does not work named with its reason, the feature cache made when missing with its disk space
reserved up front, and the W&B run it logs to (project, entity, tags; the same run after --resume)."""

import errno
import logging
import os

import numpy as np
import pytest
import torch

from captioner.checkpoint import build_model, load_checkpoint
from captioner.cli import main
from captioner.config import save_config
from captioner.core import devices
from captioner.data import feature_cache
from captioner.data.feature_cache import FeatureCache, build_feature_cache, cache_is_complete
from captioner.data.images import image_transform
from captioner.data.readers import read_split
from captioner.errors import CaptionerError
from captioner.training.distributed import World
from captioner.training.engine import prepare_feature_cache, train
from tests.conftest import tiny_config


def test_a_run_states_its_device_precision_world_and_data(tiny_coco, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="captioner.training.engine"):
        train(tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 1}))
    facts = {line.split(":", 1)[0]: line for line in caplog.messages if ":" in line}
    assert facts["device"].startswith("device: cpu = ") and torch.__version__ in facts["device"]
    threads = torch.get_num_threads()
    assert f"{threads} torch thread{'s' if threads != 1 else ''})" in facts["device"]
    assert facts["precision"] == "precision: float32 (train.amp=false); compile: False"
    assert facts["world"] == "world: 1 process, batch 5"
    # tiny_coco: 12 train images with 2 captions each, 6 val images, decoded from the image files
    assert facts["data"] == ("data: train 12 images, 24 captions; val 6 images (6 decoded per validation); "
                             "images through mobilenet_v2 at 32 px")
    assert facts["vocabulary"].startswith("vocabulary: ") and "lstm decoder" in facts["vocabulary"]


def test_bf16_is_named_when_train_amp_is_on(tiny_coco, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="captioner.training.engine"):
        train(tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 1, "amp": True}))
    precision = next(m for m in caplog.messages if m.startswith("precision: "))
    assert precision.startswith("precision: bf16 autocast (train.amp=true; a bf16 training step took ")
    assert precision.endswith("; compile: False")


def test_cuda_that_does_not_work_is_one_line_with_the_reason(tiny_coco, tmp_path, monkeypatch, capsys):
    reason = "The NVIDIA driver on your system is too old (found version 10020). Please update your GPU driver"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def init():
        raise RuntimeError(reason + "\nmore lines of advice")

    monkeypatch.setattr(torch.cuda, "init", init)
    with pytest.raises(CaptionerError, match="CUDA does not work on this machine: The NVIDIA driver on your system "
                       r"is too old \(found version 10020\)"):
        devices.resolve_device("cuda")
    config = tmp_path / "config.yaml"
    save_config(tiny_config(tiny_coco, tmp_path / "run"), config)
    assert main(["train", str(config), "run.device=cuda"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("captioner: error: run.device=cuda: CUDA does not work") and "\n" not in err
    assert not (tmp_path / "run" / "last.pt").exists()
    # auto falls back to the CPU, saying why where a driver is installed
    driver = tmp_path / "nvidia_version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.57.02  Tue Jul 13 16:14:05 UTC 2021\n")
    monkeypatch.setattr(devices, "NVIDIA_DRIVER_FILE", str(driver))
    with _warns(devices.log, "too old") as seen:
        assert devices.resolve_device("auto") == torch.device("cpu")
    assert seen
    assert devices.nvidia_driver_version() == "470.57.02"
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "has no CUDA support" in devices.cuda_unavailable_reason()


class _warns:
    """Collects the warnings a logger emits that contain ``text``."""

    def __init__(self, logger, text):
        self.logger, self.text, self.found = logger, text, []

    def __enter__(self):
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda record: self.text in record.getMessage() and self.found.append(record.getMessage())
        self.handler = handler
        self.logger.addHandler(handler)
        return self.found

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)


def _cache_inputs(tiny_coco, tmp_path):
    config = tiny_config(tiny_coco, tmp_path / "run", encoder={"image_size": 128})   # 8 x 8 regions: 74 kB
    model = build_model(config, vocab_size=5).eval()
    return model.encoder, read_split(config.data, "val"), image_transform(model.encoder)


def test_the_feature_cache_reserves_its_disk_space_when_created(tiny_coco, tmp_path):
    encoder, records, transform = _cache_inputs(tiny_coco, tmp_path)
    build_feature_cache(encoder, records, tmp_path / "cache", transform=transform, progress=False)
    path = tmp_path / "cache" / "features.npy"
    assert path.stat().st_blocks * 512 >= path.stat().st_size        # allocated, not a sparse file


@pytest.mark.parametrize("how", ["free space", "fallocate"])
def test_a_full_disk_is_one_line_before_any_feature_is_written(tiny_coco, tmp_path, monkeypatch, how):
    encoder, records, transform = _cache_inputs(tiny_coco, tmp_path)
    if how == "free space":
        usage = feature_cache.shutil.disk_usage(tmp_path)
        monkeypatch.setattr(feature_cache.shutil, "disk_usage", lambda path: usage._replace(free=1000))
    else:
        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(feature_cache.os, "posix_fallocate", full)
    encoded = []
    monkeypatch.setattr(encoder, "forward", lambda images: encoded.append(images) or None)
    with pytest.raises(CaptionerError, match=r"features.npy: the feature cache needs 0\.00 GB .* free; free some "
                       r"space or choose another folder"):
        build_feature_cache(encoder, records, tmp_path / "cache", transform=transform, progress=False)
    assert not encoded and not (tmp_path / "cache" / "features.npy").exists()


def test_training_from_a_missing_or_unfinished_cache_makes_it_first(tiny_coco, tmp_path):
    folder = tmp_path / "cache"
    config = tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 1}, data={"features": str(folder)})
    train(config)
    cache = FeatureCache(folder)
    assert cache_is_complete(folder) and cache.meta["splits"] == ["train", "val", "test"]
    assert len(cache.meta["image_ids"]) == 12 + 6 + 6
    # the same run as one started from the finished cache
    train(tiny_config(tiny_coco, tmp_path / "again", train={"epochs": 1}, data={"features": str(folder)}))
    for key, value in load_checkpoint(tmp_path / "run" / "last.pt")["model"].items():
        torch.testing.assert_close(value, load_checkpoint(tmp_path / "again" / "last.pt")["model"][key], rtol=0, atol=0)
    # an interrupted caching: its pending rows are cached when the next run starts, the others kept
    status = np.load(folder / "status.npy", mmap_mode="r+")
    status[:5] = feature_cache.PENDING
    status.flush()
    del status
    kept = np.load(folder / "features.npy")[5:].copy()
    assert not cache_is_complete(folder)
    train(tiny_config(tiny_coco, tmp_path / "run2", train={"epochs": 1}, data={"features": str(folder)}))
    assert cache_is_complete(folder)
    np.testing.assert_array_equal(np.load(folder / "features.npy")[5:], kept)
    # under torchrun the ranks cannot wait hours for rank 0: the cache is made beforehand
    status = np.load(folder / "status.npy", mmap_mode="r+")
    status[0] = feature_cache.PENDING
    status.flush()
    with pytest.raises(CaptionerError, match="no finished feature cache; make it before starting torchrun"):
        prepare_feature_cache(config, World(rank=0, size=2))


def test_wandb_project_entity_tags_and_a_resumed_run_continues_its_wandb_run(tiny_coco, tmp_path, monkeypatch):
    import wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    calls, real_init = [], wandb.init

    def recording_init(**kwargs):
        calls.append(kwargs)
        return real_init(**kwargs)

    monkeypatch.setattr(wandb, "init", recording_init)
    settings = {"wandb": "offline", "wandb_project": "coco-study", "wandb_entity": "my-team",
                "wandb_tags": ["coco", "soft"]}
    run = tmp_path / "run"
    train(tiny_config(tiny_coco, run, train={"epochs": 1, **settings}))
    train(tiny_config(tiny_coco, run, train={"epochs": 2, **settings}), resume=True)
    run_id = (run / "wandb_run_id").read_text().strip()
    assert [c["id"] for c in calls] == [run_id, run_id] and all(c["resume"] == "allow" for c in calls)
    assert all(c["project"] == "coco-study" and c["entity"] == "my-team" and c["tags"] == ["coco", "soft"]
               for c in calls)
    # both parts write under the one W&B run (a part started within the same second as the last shares its folder)
    parts = [p.name for p in (run / "wandb").iterdir() if p.name.startswith("offline-run-")]
    assert parts and all(name.endswith(f"-{run_id}") for name in parts), parts
    train(tiny_config(tiny_coco, run, train={"epochs": 1, **settings}), overwrite=True)
    assert calls[-1]["id"] != run_id                                                 # a new run, a new W&B run
    with pytest.raises(CaptionerError, match="train.wandb_tags must be a list of texts"):
        train(tiny_config(tiny_coco, tmp_path / "bad", train={"wandb_tags": [1, 2]}))
    assert not (tmp_path / "bad" / "last.pt").exists()
