"""``captioner data coco`` against a real HTTP server on 127.0.0.1 serving a COCO in miniature: twelve 32 px
JPEGs in the official zips of both years, the annotation zips, Karpathy's zip and the BLIP files of a
2/2/8 split. The module's tables (URLs, sizes, counts, sources) are pointed at it; nothing else is reached.
"""

import io
import json
import random
import re
import shutil
import threading
import zipfile
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from captioner.cli import main
from captioner.config import save_config
from captioner.data import coco_setup, download as download_module
from captioner.data.coco_setup import (Archive, KarpathySource, Rejected, check_karpathy, map_to_year,
                                       obtain_karpathy, official_split, setup_coco)
from captioner.data.download import download, part_path
from captioner.data.readers import read_karpathy_splits
from captioner.errors import CaptionerError
from tests.conftest import tiny_config

TRAIN14, VAL14 = range(1, 7), range(7, 13)          # COCO ids of the photos in each folder
TRAIN17, VAL17 = range(1, 11), range(11, 13)         # the same photos as 2017 sorts them
SPLIT = {7: "val", 8: "val", 9: "test", 11: "test", 10: "restval", 12: "restval"}   # the rest: train
COUNTS = {"train": 8, "val": 2, "test": 2}
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220)}


def captions(image_id):
    colour, side = list(COLOURS)[image_id % 3], ("left" if image_id % 2 else "right")
    return [f"a {colour} dog on the {side}", f"the dog is {colour}", f"a {colour} dog sitting on the {side}",
            f"a dog that is {colour}", f"the {colour} dog looks {side}"]


def file_name(image_id, year):
    part = "train" if image_id in (TRAIN14 if year == 2014 else TRAIN17) else "val"
    name = f"COCO_{part}2014_{image_id:012d}.jpg" if year == 2014 else f"{image_id:012d}.jpg"
    return f"{part}{year}", name


def jpeg(image_id):
    pixels = Image.new("RGB", (32, 32), (90, 90, 90))
    x = 0 if image_id % 2 else 16
    pixels.paste(COLOURS[list(COLOURS)[image_id % 3]], (x, 8, x + 16, 24))
    buffer = io.BytesIO()
    pixels.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def write_zip(path, members, stored=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED) as handle:
        for name, data in members.items():
            handle.writestr(name, data)


def karpathy_entry(image_id, split=None):
    folder, name = file_name(image_id, 2014)
    return {"filepath": folder, "filename": name, "cocoid": image_id, "imgid": image_id,
            "split": split or SPLIT.get(image_id, "train"), "sentences": [{"raw": c} for c in captions(image_id)]}


def blip_files(folder):
    train, val, test = [], [], []
    for image_id in range(1, 13):
        path = "/".join(file_name(image_id, 2014))
        split = SPLIT.get(image_id, "train")
        if split in ("train", "restval"):
            train += [{"caption": c, "image": path, "image_id": f"coco_{image_id}"} for c in captions(image_id)]
        else:
            (val if split == "val" else test).append({"image": path, "caption": captions(image_id)})
    folder.mkdir(parents=True, exist_ok=True)
    for name, items in (("train", train), ("val", val), ("test", test)):
        (folder / f"coco_karpathy_{name}.json").write_text(json.dumps(items))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The folder the server serves: zips/, annotations/, karpathy/ (good and bad), blip/."""
    folder = tmp_path_factory.mktemp("served")
    for year, parts in ((2014, (TRAIN14, VAL14)), (2017, (TRAIN17, VAL17))):
        annotations = {}
        for part, ids in zip(("train", "val"), parts):
            images = [{"id": i, "file_name": file_name(i, year)[1], "width": 32, "height": 32} for i in ids]
            write_zip(folder / "zips" / f"{part}{year}.zip",
                      {f"{part}{year}/": b"", **{f"{part}{year}/{file_name(i, year)[1]}": jpeg(i) for i in ids}},
                      stored=True)
            caps = [{"id": i * 10 + k, "image_id": i, "caption": c} for i in ids for k, c in enumerate(captions(i))]
            x = [{"id": i, "image_id": i, "category_id": 18, "iscrowd": 0, "area": 256.0,
                  "bbox": [0 if i % 2 else 16, 8, 16, 16],
                  "segmentation": [[0 if i % 2 else 16, 8, 16 if i % 2 else 32, 8, 16 if i % 2 else 32, 24,
                                    0 if i % 2 else 16, 24]]} for i in ids]
            annotations[f"annotations/captions_{part}{year}.json"] = json.dumps({"images": images, "annotations": caps})
            annotations[f"annotations/instances_{part}{year}.json"] = json.dumps(
                {"images": images, "annotations": x, "categories": [{"id": 18, "name": "dog", "supercategory": "animal"}]})
            annotations[f"annotations/person_keypoints_{part}{year}.json"] = "{}"
        write_zip(folder / "annotations" / f"annotations_trainval{year}.zip", annotations)
    good = {"images": [karpathy_entry(i) for i in range(1, 13)], "dataset": "coco"}
    write_zip(folder / "karpathy" / "caption_datasets.zip",
              {"dataset_coco.json": json.dumps(good), "dataset_flickr8k.json": "{}"})
    bad = {"images": [karpathy_entry(i, "train" if i == 11 else None) for i in range(1, 13)]}   # one test id short
    write_zip(folder / "bad" / "caption_datasets.zip", {"dataset_coco.json": json.dumps(bad)})
    blip_files(folder / "blip")
    return folder


class Server:
    """A ThreadingHTTPServer on 127.0.0.1 serving ``folder``: ``Range: bytes=N-`` answered with 206, paths in
    ``missing`` with 404, a path in ``cut`` ({path: K}) cut after K bytes of its body the first time; every
    request logged as (path, Range header)."""

    def __init__(self, folder: Path):
        self.folder, self.requests, self.missing, self.cut = folder, [], set(), {}
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path, span = self.path.split("?")[0], self.headers.get("Range")
                state.requests.append((path, span))
                file = state.folder / path.lstrip("/")
                if path in state.missing or not file.is_file():
                    self.send_error(404)
                    return
                data, start = file.read_bytes(), 0
                if span:
                    start = int(re.fullmatch(r"bytes=(\d+)-", span).group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                cut = state.cut.pop(path, None)
                self.wfile.write(body if cut is None else body[:cut])
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def paths(self):
        return [path for path, _ in self.requests]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(served, tmp_path, monkeypatch):
    """A server of a fresh copy of ``served``, with the module's tables pointed at it and sized to it."""
    folder = tmp_path / "served"
    shutil.copytree(served, folder)
    server = Server(folder)
    archives = {}
    for path in (*folder.glob("zips/*.zip"), *folder.glob("annotations/*.zip")):
        with zipfile.ZipFile(path) as handle:
            images = sum(n.endswith(".jpg") for n in handle.namelist())
            archives[path.name] = Archive(path.stat().st_size, sum(i.file_size for i in handle.infolist()), images)
    monkeypatch.setattr(coco_setup, "COCO_URL", server.url)
    monkeypatch.setattr(coco_setup, "ARCHIVES", archives)
    monkeypatch.setattr(coco_setup, "KARPATHY_COUNTS", dict(COUNTS))
    monkeypatch.setattr(coco_setup, "HELD_OUT", 2)
    monkeypatch.setattr(coco_setup, "OUTPUT_BYTES", 10_000)
    monkeypatch.setattr(coco_setup, "KARPATHY_SOURCES", [
        KarpathySource("Karpathy's zip", "karpathy_zip", (f"{server.url}/karpathy/caption_datasets.zip",)),
        KarpathySource("BLIP files", "blip", tuple(f"{server.url}/blip/coco_karpathy_{p}.json"
                                                   for p in ("train", "val", "test")))])
    monkeypatch.setattr(download_module, "BACKOFF_S", 0.0)
    yield server
    server.close()


def by_split(data):
    out = {}
    for entry in data["images"]:
        out.setdefault("train" if entry["split"] == "restval" else entry["split"], set()).add(entry["cocoid"])
    return out


def test_a_connection_cut_mid_body_resumes_with_a_range_request(server, tmp_path):
    payload = random.Random(0).randbytes(300_000)
    (server.folder / "blob.bin").write_bytes(payload)
    server.cut["/blob.bin"] = 120_000
    dest = download(f"{server.url}/blob.bin", tmp_path / "got" / "blob.bin", progress=False)
    assert dest.read_bytes() == payload and not part_path(dest).exists()
    assert server.requests == [("/blob.bin", None), ("/blob.bin", "bytes=120000-")]
    assert download(f"{server.url}/blob.bin", dest) == dest and len(server.requests) == 2   # whole: not fetched again


def test_a_dead_first_karpathy_source_falls_back_to_the_blip_files(server, tmp_path):
    server.missing.add("/karpathy/caption_datasets.zip")
    root = tmp_path / "coco"
    result = obtain_karpathy(root)
    assert result["source"].startswith("BLIP files") and result["counts"] == COUNTS
    assert server.paths() == ["/karpathy/caption_datasets.zip"] + [f"/blip/coco_karpathy_{p}.json"
                                                                    for p in ("train", "val", "test")]
    data = json.loads((root / "dataset_coco_karpathy.json").read_text())
    assert by_split(data) == {"train": {1, 2, 3, 4, 5, 6, 10, 12}, "val": {7, 8}, "test": {9, 11}}
    restval = next(e for e in data["images"] if e["cocoid"] == 10)       # a val2014 photo in train
    assert (restval["filepath"], restval["split"], len(restval["sentences"])) == ("val2014", "train", 5)
    assert [r.image_id for r in read_karpathy_splits(root / "dataset_coco_karpathy.json", root, ("test",))["test"]] == [9, 11]
    assert not list((root / "downloads").iterdir())       # the BLIP files go once converted (no --keep-zips)


def test_every_source_failing_is_one_line_naming_each_and_how_to_place_the_file(server, tmp_path):
    server.missing |= {"/karpathy/caption_datasets.zip", "/blip/coco_karpathy_val.json"}
    with pytest.raises(CaptionerError) as error:
        obtain_karpathy(tmp_path / "coco", karpathy_file=tmp_path / "nowhere.json")
    message = str(error.value)
    assert "\n" not in message
    assert re.search(r"--karpathy-file \S*nowhere.json: not found; Karpathy's zip \(\S+caption_datasets.zip\): "
                     r"HTTP 404 Not Found; BLIP files \(.*\): HTTP 404 Not Found; place Karpathy's dataset_coco.json",
                     message), message
    assert "--karpathy-file PATH" in message and not (tmp_path / "coco" / "dataset_coco_karpathy.json").exists()


def test_a_source_of_the_wrong_content_is_rejected_and_the_next_one_tried(server, tmp_path, caplog):
    bad = KarpathySource("a bad copy", "karpathy_zip", (f"{server.url}/bad/caption_datasets.zip",))
    coco_setup.KARPATHY_SOURCES.insert(0, bad)
    root = tmp_path / "coco"
    result = obtain_karpathy(root)
    assert result["source"].startswith("Karpathy's zip")
    assert "a bad copy" in caplog.text and "9 train+restval images, 8 expected and 1 test images, 2 expected" in caplog.text
    assert not (root / "downloads" / "caption_datasets.zip").exists()
    good = json.loads((root / "dataset_coco_karpathy.json").read_text())
    assert by_split(good)["test"] == {9, 11}
    twice = {"images": [karpathy_entry(i) for i in range(1, 13)] + [karpathy_entry(7, "test")]}
    with pytest.raises(Rejected, match="COCO id 7 is in both val and test"):
        check_karpathy(twice)
    few = {"images": [karpathy_entry(i) for i in range(1, 13)]}
    few["images"][3]["sentences"] = few["images"][3]["sentences"][:4]
    with pytest.raises(Rejected, match="1 images with fewer than 5 captions \\(COCO id 4: 4\\)"):
        check_karpathy(few)


def test_a_damaged_zip_is_downloaded_again_once_then_named(server, tmp_path):
    zip_path = server.folder / "zips" / "val2014.zip"
    with zipfile.ZipFile(zip_path) as handle:
        info = handle.getinfo(f"val2014/{file_name(8, 2014)[1]}")
    data = bytearray(zip_path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + 100 : start + 104] = bytes(b ^ 0xFF for b in data[start + 100 : start + 104])
    zip_path.write_bytes(bytes(data))
    root = tmp_path / "coco"
    with pytest.raises(CaptionerError, match=r"val2014.zip: damaged zip \(Bad CRC-32 for file 'val2014/COCO_val2014_"
                                             r"000000000008.jpg'\) again after a fresh download from http"):
        setup_coco(root)
    assert server.paths().count("/zips/val2014.zip") == 2
    assert not (root / "val2014").exists() and not list(root.glob(".*unpacking"))
    assert not (root / "downloads" / "val2014.zip").exists()
    assert (root / "annotations" / "captions_val2014.json").is_file()     # the steps before it stand


def test_too_little_disk_is_refused_before_any_request(server, tmp_path, monkeypatch, capsys):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(coco_setup.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 5_000, 5_000))
    assert main(["data", "coco", "--root", str(tmp_path / "coco")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("captioner: error: ") and "Traceback" not in err
    assert re.search(r"not enough free disk space: \d+ kB needed, 5 kB free \(one after the other, each zip deleted "
                     r"once unpacked: annotations_trainval2014.zip \d+ kB \+ unpacked \d+ kB, val2014.zip .*train2014.zip",
                     err), err
    assert server.requests == []


def test_a_second_run_downloads_nothing_and_says_it_verified(server, tmp_path):
    root = tmp_path / "coco"
    first = setup_coco(root)
    assert first["downloaded_bytes"] > 0 and first["outputs"] == "written"
    assert not (root / "downloads" / "train2014.zip").exists()      # deleted once unpacked
    requests, stamps = len(server.requests), {n: (root / n).stat().st_mtime_ns for n in coco_setup.OUTPUTS}
    second = setup_coco(root)
    assert len(server.requests) == requests
    assert {k: v["status"] for k, v in second["images"].items()} == dict.fromkeys(("annotations", "val2014", "train2014"),
                                                                                   "verified")
    assert second["outputs"] == "verified" and second["counts"] == first["counts"]
    assert {n: (root / n).stat().st_mtime_ns for n in coco_setup.OUTPUTS} == stamps
    assert "nothing downloaded; everything was in place and verified" in coco_setup.format_summary(second)


def test_2017_maps_the_karpathy_split_to_2017_file_names_by_coco_id(server, tmp_path):
    root = tmp_path / "coco"
    result = setup_coco(root, year=2017)
    assert {s: c["images"] for s, c in result["counts"].items()} == COUNTS
    data = json.loads((root / "dataset_coco.json").read_text())
    where = {e["cocoid"]: (e["filepath"], e["filename"]) for e in data["images"]}
    assert where[9] == ("train2017", "000000000009.jpg") and where[11] == ("val2017", "000000000011.jpg")
    assert where[10] == ("train2017", "000000000010.jpg")             # a restval photo of val2014
    assert by_split(data) == by_split(json.loads((root / "dataset_coco_karpathy.json").read_text()))
    assert json.loads((root / "dataset_coco_karpathy.json").read_text())["images"][0]["filepath"] == "train2014"
    for split in ("train", "val", "test"):
        assert all(r.path.is_file() for r in read_karpathy_splits(root / "dataset_coco.json", root, (split,))[split])
    instances = json.loads((root / "instances_valtest.json").read_text())
    assert sorted(i["id"] for i in instances["images"]) == [7, 8, 9, 11]       # test photos in both 2017 folders
    assert sorted(a["image_id"] for a in instances["annotations"]) == [7, 8, 9, 11]
    folders = {i: f for i, f in coco_setup._image_folders(root, 2017).items() if i != 11}
    with pytest.raises(CaptionerError, match=r"1 of the Karpathy split's 12 images are not among the 2017 images "
                                             r"\(COCO id 11\)"):
        map_to_year(data["images"], folders, 2017)


def test_the_official_split_holds_out_a_fixed_part_of_train2017(server, tmp_path, capsys):
    root = tmp_path / "coco"
    assert main(["data", "coco", "--root", str(root), "--year", "2017", "--split", "official"]) == 0
    assert not [p for p in server.paths() if p.startswith(("/karpathy", "/blip"))]    # no split file needed
    splits = by_split(json.loads((root / "dataset_coco.json").read_text()))
    assert len(splits["val"]) == 2 and splits["val"] <= set(TRAIN17) and splits["test"] == set(VAL17)
    assert splits["train"] == set(TRAIN17) - splits["val"]
    assert splits["val"] == set(random.Random(coco_setup.HELD_OUT_SEED).sample(list(TRAIN17), 2))
    assert official_split(root) == official_split(root)
    instances = json.loads((root / "instances_valtest.json").read_text())
    assert {i["id"] for i in instances["images"]} == splits["val"] | splits["test"]
    capsys.readouterr()
    assert main(["data", "coco", "--root", str(tmp_path / "other"), "--split", "official"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--split official is the 2017 split" in err and "--year 2017" in err


def test_data_coco_then_train_and_evaluate_through_the_command_line(server, tmp_path, capsys):
    root = tmp_path / "coco"
    assert main(["data", "coco", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "train 8 images (40 captions), val 2 images (10 captions), test 2 images (10 captions)" in out
    assert f"captioner train coco_soft data.karpathy={root}/dataset_coco.json" in out
    setup = json.loads((root / "coco_setup.json").read_text())
    assert setup["year"] == 2014 and setup["split"] == "karpathy" and setup["sources"]["split"].startswith("Karpathy's")
    assert json.loads((root / "vocab.json").read_text())["words"][4] == "dog"     # in every caption, 5+ times
    config = tmp_path / "tiny.yaml"
    save_config(tiny_config(tmp_path, tmp_path / "run", train={"epochs": 1}), config)
    data = ["data.format=karpathy", f"data.karpathy={root}/dataset_coco.json", f"data.image_root={root}",
            f"data.vocab={root}/vocab.json", "data.features=null"]
    assert main(["train", str(config), *data, "--no-wandb"]) == 0
    instances = "data.instances=" + json.dumps({"test": str(root / "instances_valtest.json")})
    assert main(["evaluate", "--checkpoint", str(tmp_path / "run" / "best.pt"), instances, "--split", "test",
                 "--beam", "2",
                 "--out", str(tmp_path / "run"), "--device", "cpu"]) == 0
    scores = json.loads((tmp_path / "run" / "scores_test.json").read_text())
    assert scores["images"] == 2 and "CIDEr" in scores and scores["grounding"]["images_grounded"] == 2
