"""Two gloo processes under torchrun train like one process over the same global batch."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from captioner.checkpoint import build_model, load_checkpoint
from captioner.config import save_config
from captioner.core.randomness import seed_everything
from captioner.data.dataset import EpochSampler
from captioner.training.engine import train
from tests.conftest import tiny_config

REPO = Path(__file__).resolve().parent.parent

# Records each rank's weights after every epoch (ranks other than 0 write no checkpoint).
RANK_RECORDER = """
    import os, sys, torch
    from captioner.config import load_config
    from captioner.training import engine

    real_epoch = engine.train_one_epoch

    def recording_epoch(run, *args, **kwargs):
        finished = real_epoch(run, *args, **kwargs)
        torch.save(run.model.state_dict(), os.path.join(sys.argv[2], f"rank{os.environ['RANK']}.pt"))
        return finished

    engine.train_one_epoch = recording_epoch
    engine.train(load_config(sys.argv[1]))
"""


def test_ranks_batches_together_make_the_global_batch():
    single = list(EpochSampler(24, seed=3))
    ranks = [list(EpochSampler(24, seed=3, rank=r, world_size=2)) for r in range(2)]
    for k in range(4):  # global batch 6 = two rank batches of 3
        assert sorted(ranks[0][3 * k : 3 * k + 3] + ranks[1][3 * k : 3 * k + 3]) == sorted(single[6 * k : 6 * k + 6])


def test_bucketing_by_length_keeps_every_item_once_and_groups_similar_lengths():
    lengths = [(7 * i) % 13 for i in range(200)]
    sampler = EpochSampler(200, seed=0, lengths=lengths, bucket_batch=10)
    order = list(sampler)
    assert sorted(order) == list(range(200))
    spreads = [max(lengths[i] for i in order[k : k + 10]) - min(lengths[i] for i in order[k : k + 10])
               for k in range(0, 200, 10)]
    assert max(spreads) <= 1                      # 200 items of 13 lengths: each batch nearly one length
    sampler.set_epoch(0, start=50)
    assert list(sampler) == order[50:]            # resumable mid-epoch like the plain order


def test_two_gloo_processes_train_like_one_process_with_the_same_global_batch(tiny_coco, tmp_path):
    common = {"train": {"epochs": 2, "batch_size": 6}, "model": {"lstm": {"dropout": 0.0}}, "loss": {"doubly_stochastic": 0.0}}
    train(tiny_config(tiny_coco, tmp_path / "single", **common))
    save_config(tiny_config(tiny_coco, tmp_path / "ddp", **common), tmp_path / "config.yaml")
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(RANK_RECORDER))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(driver), str(tmp_path / "config.yaml"), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
    single = load_checkpoint(tmp_path / "single" / "last.pt")
    distributed = load_checkpoint(tmp_path / "ddp" / "last.pt")
    assert distributed["progress"]["step"] == single["progress"]["step"] == 8
    for name, weights in single["model"].items():
        torch.testing.assert_close(distributed["model"][name], weights, rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(rank0[name], weights, rtol=1e-4, atol=1e-5, msg=name)
    assert not list((tmp_path / "ddp").glob("rank*"))  # only rank 0 wrote the run folder


def test_cpu_switches_channels_last_a_no_op_amp_and_compile_close_to_float32(tiny_coco, tmp_path):
    """channels_last only changes CUDA convolutions' memory layout: on the CPU the run is bit for bit the same.
    ``train.amp`` (bf16 autocast) and ``train.compile`` (the compiled per-word step) do act on the CPU: the run
    with both goes the same way as float32 (tests/test_speed_levers.py bounds each lever more tightly)."""
    for run, switches in (("plain", {}), ("layout", {"channels_last": True}), ("levers", {"amp": True, "compile": True})):
        train(tiny_config(tiny_coco, tmp_path / run, train={"epochs": 1, **switches}))
    plain_checkpoint = load_checkpoint(tmp_path / "plain" / "last.pt")
    plain, layout, levers = plain_checkpoint["model"], *(load_checkpoint(tmp_path / run / "last.pt")["model"]
                                                        for run in ("layout", "levers"))
    for name in plain:
        assert torch.equal(plain[name], layout[name]), name
    seed_everything(0)                                   # the run's seed: the weights every run started from
    start = build_model(tiny_config(tiny_coco, tmp_path / "plain"), len(plain_checkpoint["vocab"]["words"])).state_dict()
    moved = torch.cat([(plain[n].float() - start[n].float()).flatten() for n in plain])
    apart = torch.cat([(levers[n].float() - plain[n].float()).flatten() for n in plain])
    assert torch.isfinite(apart).all() and moved.norm() > 0
    assert apart.norm() < 0.25 * moved.norm(), (apart.norm(), moved.norm())   # the runs went the same way
