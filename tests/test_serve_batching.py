"""The dynamic batcher of `captioner serve`: jobs queued together are decoded as one batch per (checkpoint,
beam size), with the same captions as one at a time; never more than max_batch; failures and cancellations
stay with their own jobs. Jobs are queued before the worker starts, so what it finds is known: no test
depends on timing."""

import concurrent.futures
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from captioner.data.images import load_image
from captioner.errors import CaptionerError, ImageError
from captioner.serve.batching import DynamicBatcher
from captioner.serve.checkpoints import load_served_models
from captioner.serve.decoding_process import DecodingProcess, LoadSettings
from captioner.serve.errors import Unavailable


@pytest.fixture(scope="module")
def served(served_checkpoints):
    return load_served_models(list(served_checkpoints.values()), torch.device("cpu"))


@pytest.fixture(scope="module")
def tensors(served, tiny_coco):
    """Each test image as each checkpoint's encoder input, by checkpoint name."""
    paths = sorted((tiny_coco / "images" / "test").glob("*.png")) + sorted((tiny_coco / "images" / "val").glob("*.png"))
    return {name: [model.read(path.read_bytes(), path.name).pixels for path in paths] for name, model in served.items()}


def run_queued(batcher: DynamicBatcher, jobs: list) -> list:
    """Queue every ``(key, item)`` before the worker starts; then let it run; return ``(result, timing)``s."""
    futures = [batcher.submit_nowait(key, item) for key, item in jobs]
    with batcher:
        return [future.result(timeout=120) for future in futures]


def decode_group(served):
    return lambda key, images: served[key[0]].caption(images, key[1])


def assert_same_captions(batched, alone):
    assert len(batched) == len(alone)
    for together, one in zip(batched, alone):
        assert [g.tokens for g in together] == [g.tokens for g in one]
        assert [g.log_prob for g in together] == pytest.approx([g.log_prob for g in one], abs=1e-4)
        for a, b in zip(together, one):
            assert torch.allclose(a.attention["alpha"], b.attention["alpha"], atol=1e-5)


@pytest.mark.parametrize("name, beam", [("soft", 3), ("hard", 2), ("wide", 1), ("transformer", 3)])
def test_a_batch_gives_the_captions_of_one_at_a_time_decoding(served, tensors, name, beam):
    images = tensors[name]
    results = run_queued(DynamicBatcher(decode_group(served), max_batch=64, max_wait_s=0),
                         [((name, beam), image) for image in images])
    assert [timing.batch_size for _, timing in results] == [len(images)] * len(images)
    assert_same_captions([beams for beams, _ in results], [served[name].caption([image], beam)[0] for image in images])


def test_jobs_of_different_checkpoints_and_beams_are_never_decoded_together(served, tensors):
    keys = [("soft", 1), ("hard", 3), ("soft", 2), ("wide", 3)]
    jobs = [(keys[k % len(keys)], tensors[keys[k % len(keys)][0]][k]) for k in range(12)]
    seen = []
    handler = decode_group(served)
    results = run_queued(DynamicBatcher(lambda key, images: seen.append((key, len(images))) or handler(key, images),
                                        max_batch=12, max_wait_s=0), jobs)
    assert sorted(seen) == sorted((key, 3) for key in keys)
    for (key, image), (beams, timing) in zip(jobs, results):
        assert timing.batch_size == 3
        assert_same_captions([beams], served[key[0]].caption([image], key[1]))


def test_batches_hold_at_most_max_batch_jobs_in_arrival_order():
    seen = []
    results = run_queued(DynamicBatcher(lambda key, items: seen.append(list(items)) or [i * 10 for i in items],
                                        max_batch=2, max_wait_s=0), [("k", i) for i in range(5)])
    assert seen == [[0, 1], [2, 3], [4]]
    assert [result for result, _ in results] == [0, 10, 20, 30, 40]
    assert [timing.batch_size for _, timing in results] == [2, 2, 2, 2, 1]


def test_the_worker_waits_for_announced_requests_and_stops_waiting_at_max_batch():
    with DynamicBatcher(lambda key, items: items, max_batch=3, max_wait_s=600) as batcher, contextlib.ExitStack() as stack:
        arrivals = [stack.enter_context(batcher.arrival()) for _ in range(4)]
        futures = [arrival.submit_nowait("k", n) for n, arrival in enumerate(arrivals[:3])]
        results = [future.result(timeout=120) for future in futures]   # long before the 600 s
    assert [result for result, _ in results] == [0, 1, 2] and {timing.batch_size for _, timing in results} == {3}


def test_a_lone_request_is_decoded_at_once_and_one_that_leaves_unsubmitted_stops_the_wait():
    with DynamicBatcher(lambda key, items: items, max_batch=8, max_wait_s=600) as batcher:
        assert batcher.submit_nowait("k", 1).result(timeout=120)[0] == 1   # nothing announced: no wait of 600 s
        with batcher.arrival() as arrival:
            with batcher.arrival():            # a second request on its way: the worker waits for it ...
                future = arrival.submit_nowait("k", 2)
                with pytest.raises(concurrent.futures.TimeoutError):
                    future.result(timeout=0.5)
            result, timing = future.result(timeout=120)   # ... until it leaves without a job (a refused upload)
        with pytest.raises(RuntimeError, match="one job"):
            arrival.submit_nowait("k", 3)
    assert (result, timing.batch_size) == (2, 1)


def test_a_failing_group_fails_its_own_jobs_only_and_the_worker_goes_on():
    def handler(key, items):
        if key == "bad":
            raise RuntimeError("decoder exploded")
        return items

    batcher = DynamicBatcher(handler, max_batch=8, max_wait_s=0)
    futures = [batcher.submit_nowait(key, n) for n, key in enumerate(["good", "bad", "good"])]
    with batcher:
        assert futures[0].result(timeout=60)[0] == 0 and futures[2].result(timeout=60)[0] == 2
        with pytest.raises(RuntimeError, match="exploded"):
            futures[1].result(timeout=60)
        assert batcher.submit_nowait("good", 7).result(timeout=60)[0] == 7


def test_cancelled_jobs_are_skipped_and_closing_cancels_what_is_left():
    seen = []
    batcher = DynamicBatcher(lambda key, items: seen.extend(items) or items, max_batch=8, max_wait_s=0)
    futures = [batcher.submit_nowait("k", n) for n in range(3)]
    futures[1].cancel()
    with batcher:
        assert [futures[0].result(timeout=60)[0], futures[2].result(timeout=60)[0]] == [0, 2]
    assert seen == [0, 2]
    late = DynamicBatcher(lambda key, items: items)
    queued = late.submit_nowait("k", 1)
    late.close()                              # never started: the queued job is cancelled, not lost
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        late.submit_nowait("k", 2)


def test_the_decoding_process_gives_the_captions_of_the_server_process(served, served_checkpoints, tensors, tiny_coco):
    """The models in a child process (captioner serve's default) decode every checkpoint's batches as the
    models of the server's own process do; a failing batch fails alone and the child goes on; a child killed
    fails its batch with a 503 and is replaced. The server's process gets descriptions without weights, which
    read uploads and describe the models as the loaded ones."""
    tiny_png = next((tiny_coco / "images" / "test").glob("*.png")).read_bytes()
    names = list(served_checkpoints)
    with DecodingProcess(LoadSettings([str(served_checkpoints[name]) for name in names], "cpu")) as process:
        assert list(process.models) == names
        for name, description in process.models.items():
            assert description.predictor is None and description.describe() == served[name].describe()
            assert torch.equal(description.read(tiny_png, "a.png").pixels, served[name].read(tiny_png, "a.png").pixels)
        for name, beam in [("soft", 3), ("hard", 2), ("transformer", 2)]:
            assert_same_captions(process.caption((name, beam), tensors[name]), served[name].caption(tensors[name], beam))
        with pytest.raises(RuntimeError, match="decoding failed in the decoding process: KeyError"):
            process.caption(("nobody", 1), tensors["soft"])
        assert_same_captions(process.caption(("wide", 1), tensors["wide"][:1]), served["wide"].caption(tensors["wide"][:1], 1))
        assert process.ready and process.problem is None
        os.kill(process._process.pid, signal.SIGKILL)         # killed (the OOM killer): a 503, then a new child
        with pytest.raises(Unavailable, match="the decoding process ended") as refused:
            process.caption(("soft", 1), tensors["soft"])
        assert refused.value.status == 503 and int(refused.value.headers["Retry-After"]) >= 1
        deadline = time.monotonic() + 120
        while not process.ready and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.ready and process.restarts == 1
        assert_same_captions(process.caption(("soft", 3), tensors["soft"]), served["soft"].caption(tensors["soft"], 3))
    assert not process.ready and process.problem == "the server is stopping"
    with pytest.raises(CaptionerError, match="missing.pt: checkpoint not found"):    # a user's error, as it is
        DecodingProcess(LoadSettings([str(Path(served_checkpoints["soft"]).parent / "missing.pt")], "cpu")).start()


def test_read_refuses_bad_bytes_with_the_upload_name(served, tiny_coco):
    path = next((tiny_coco / "images" / "test").glob("*.png"))
    image, size, tensor = served["wide"].read(path.read_bytes(), "cat.png")
    assert image.size == size == load_image(path).size and tensor.shape == (3, 32, 64) and tensor.dtype == torch.uint8
    with pytest.raises(ImageError, match=r"^cat\.png: .*empty"):
        served["wide"].read(b"", "cat.png")
