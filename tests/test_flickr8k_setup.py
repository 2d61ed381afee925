"""``captioner data flickr8k`` against a real HTTP server on 127.0.0.1 serving Flickr8k in miniature: its two
archives in the real layout (the photos under the misspelt ``Flicker8k_Dataset/``, ``__MACOSX`` resource forks, the
text files at the top) with the caption file's glitches, 13 tiny JPEGs in all. The module's URL, MD5s and sizes are
pointed at them; nothing else is reached. Then the split it writes trains ``flickr8k_full_soft`` (tiny) and scores
its test photos."""

import io
import json
import re
import shutil
import zipfile
from pathlib import Path

import pytest
from PIL import Image

from captioner.cli import main
from captioner.config import load_config, recipes
from captioner.data import download as download_module
from captioner.data import flickr8k_setup
from captioner.data.archives import file_md5
from captioner.data.download import part_path
from captioner.data.readers import read_coco_captions, read_split
from captioner.errors import CaptionerError
from captioner.training.engine import train
from captioner.workflows.evaluate import evaluate_checkpoint
from tests.test_coco_setup import Server

NAMES = [f"{1000 + k}_{k:02x}c0ffee.jpg" for k in range(12)]
TRAIN, VAL, TEST = NAMES[:6], NAMES[6:9], NAMES[9:]
MISSING = "9999999999_0000000000.jpg"           # listed for training, no such photo
UNCAPTIONED = TEST[-1]                          # a photo listed for test without a caption
UNUSED = "1099_unused.jpg"                      # a photo in no list
ORPHAN = "2258277193_586949ec62.jpg.1"          # captions keyed to a name that is no photo, as in the real file
COUNTS = {"train": {"images": 6, "captions": 30}, "val": {"images": 3, "captions": 15},
          "test": {"images": 2, "captions": 10}}
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220)}


def captions(k):
    colour = list(COLOURS)[k % 3]
    return [f"A {colour} dog runs on the grass .", f"The dog is {colour} .", f"A {colour} dog plays outside",
            f"a dog that is {colour}", f"the {colour} dog is running"]


def jpeg(k):
    pixels = Image.new("RGB", (32, 32), (90, 90, 90))
    pixels.paste(COLOURS[list(COLOURS)[k % 3]], (8, 8, 24, 24))
    buffer = io.BytesIO()
    pixels.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def archives(folder: Path) -> Path:
    """``Flickr8k_Dataset.zip`` and ``Flickr8k_text.zip`` in ``folder``, laid out as the mirror's."""
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "Flickr8k_Dataset.zip", "w", zipfile.ZIP_STORED) as handle:
        handle.writestr("Flicker8k_Dataset/", b"")
        for k, name in enumerate([*NAMES, UNUSED]):
            handle.writestr(f"Flicker8k_Dataset/{name}", jpeg(k))
            handle.writestr(f"__MACOSX/Flicker8k_Dataset/._{name}", b"\x00\x05\x16\x07 not a photo")
    token = [f"{name}#{i}\t{caption}" for k, name in enumerate(NAMES) if name != UNCAPTIONED
             for i, caption in enumerate(captions(k))]
    token += [f"{ORPHAN}#{i}\ta dog on a beach" for i in range(5)] + ["a line with no tab or number"]
    with zipfile.ZipFile(folder / "Flickr8k_text.zip", "w", zipfile.ZIP_DEFLATED) as handle:
        handle.writestr("Flickr8k.token.txt", "\n".join(token) + "\n")
        handle.writestr("Flickr8k.lemma.token.txt", "\n".join(token) + "\n")
        handle.writestr("Flickr_8k.trainImages.txt", "\n".join([*TRAIN[::-1], MISSING]) + "\n")   # not sorted
        handle.writestr("Flickr_8k.devImages.txt", "\n".join(VAL) + "\n")
        handle.writestr("Flickr_8k.testImages.txt", "\n".join(TEST) + "\n\n")
        handle.writestr("readme.txt", "Flickr8k: research use only")
        handle.writestr("__MACOSX/._Flickr8k.token.txt", b"\x00\x05\x16\x07")
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    return archives(tmp_path_factory.mktemp("served"))


@pytest.fixture
def server(served, tmp_path, monkeypatch):
    """A server of a fresh copy of the archives, the module's URL and MD5s pointed at them."""
    folder = tmp_path / "served"
    shutil.copytree(served, folder)
    server = Server(folder)
    monkeypatch.setattr(flickr8k_setup, "RELEASE", server.url)
    monkeypatch.setattr(flickr8k_setup, "MD5", {path.name: file_md5(path) for path in folder.glob("*.zip")})
    monkeypatch.setattr(flickr8k_setup, "ZIP_BYTES", {path.name: path.stat().st_size for path in folder.glob("*.zip")})
    monkeypatch.setattr(download_module, "BACKOFF_S", 0.0)
    yield server
    server.close()


def check_split(root: Path) -> dict:
    """The split in ``root``: the counts, the order and the fields the recipes and the readers rely on."""
    data = json.loads((root / "dataset_flickr8k.json").read_text())
    assert data["dataset"] == "flickr8k"
    by_split = {split: [e["filename"] for e in data["images"] if e["split"] == split] for split in COUNTS}
    assert by_split == {"train": sorted(TRAIN), "val": sorted(VAL), "test": sorted(TEST[:-1])}
    assert [e["imgid"] for e in data["images"]] == list(range(11))
    first = data["images"][0]
    assert first["filepath"] == "images" and first["sentids"] == [0, 1, 2, 3, 4]
    assert first["sentences"][0] == {"raw": "A red dog runs on the grass .", "imgid": 0, "sentid": 0,
                                     "tokens": ["a", "red", "dog", "runs", "on", "the", "grass"]}
    assert data["images"][1]["sentids"] == [5, 6, 7, 8, 9]
    setup = json.loads((root / "flickr8k_setup.json").read_text())
    assert setup["counts"] == COUNTS and setup["unused"] == 1
    skipped = setup["skipped"]
    assert skipped["captions_without_photo"] == {"names": 1, "captions": 5, "shown": [ORPHAN]}
    assert skipped["listed_without_photo"] == {"names": 1, "shown": [MISSING]}
    assert skipped["listed_without_captions"] == {"names": 1, "shown": [UNCAPTIONED]}
    assert skipped["malformed"] == 1
    config = load_config(recipes()["flickr8k_full_soft"], [f"data.karpathy={root / 'dataset_flickr8k.json'}",
                                                           f"data.image_root={root}"])
    records = read_split(config.data, "test")
    assert [r.path for r in records] == [root / "images" / name for name in sorted(TEST[:-1])]
    assert all(r.path.is_file() and len(r.captions) == 5 for r in records)
    for split in COUNTS:      # the COCO-format files hold the same photos, ids and captions as the split file
        coco = read_coco_captions(root / "annotations" / f"captions_{split}.json", root / "images", split)
        assert coco == read_split(config.data, split)
    assert sorted(setup["outputs"]) == ["annotations/captions_test.json", "annotations/captions_train.json",
                                        "annotations/captions_val.json", "dataset_flickr8k.json"]
    return setup


def test_download_checks_unpacks_and_writes_the_official_split_then_a_second_run_only_verifies(server, tmp_path,
                                                                                              capsys):
    root = tmp_path / "flickr8k"
    assert main(["data", "flickr8k", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "split: train 6 photos (30 captions), val 3 photos (15 captions), test 2 photos (10 captions)" in out
    assert (f"skipped: 5 captions of 1 name that is no photo ({ORPHAN}); 1 listed name without a photo ({MISSING}); "
            f"1 listed photo without a caption ({UNCAPTIONED}); 1 line or entry that cannot be read") in out
    assert "unused: 1 photo in no split" in out
    train = f"captioner train flickr8k_full_soft_lite2 data.karpathy={root}/dataset_flickr8k.json data.image_root={root}"
    assert train in out
    assert "captioner evaluate --checkpoint runs/flickr8k_full_soft_lite2/best.pt --split test" in out
    check_split(root)
    assert sorted(p.name for p in (root / "images").iterdir()) == sorted([*NAMES, UNUSED])   # no ._ forks
    assert (root / "text" / "readme.txt").is_file() and not list((root / "downloads").iterdir())
    assert sorted(server.paths()) == ["/Flickr8k_Dataset.zip", "/Flickr8k_text.zip"]
    stamps = {name: (root / name).stat().st_mtime_ns
              for name in ("dataset_flickr8k.json", "flickr8k_setup.json", "annotations/captions_test.json")}

    assert main(["data", "flickr8k", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert len(server.requests) == 2
    assert {name: (root / name).stat().st_mtime_ns for name in stamps} == stamps
    assert "up to date (verified)" in out and "nothing downloaded; everything was in place and verified" in out
    assert "train 6 photos (30 captions)" in out and f"({ORPHAN})" in out


def test_a_connection_cut_mid_archive_resumes_with_a_range_request(server, tmp_path):
    server.cut["/Flickr8k_Dataset.zip"] = 2_000
    root = tmp_path / "flickr8k"
    result = flickr8k_setup.setup_flickr8k(root)
    assert ("/Flickr8k_Dataset.zip", "bytes=2000-") in server.requests
    assert result["counts"] == COUNTS and result["outputs"] == "written"
    assert result["downloaded_bytes"] == sum(p.stat().st_size for p in server.folder.glob("*.zip"))
    check_split(root)


def test_a_wrong_checksum_is_one_line_and_nothing_half_written_is_used(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(flickr8k_setup.MD5, "Flickr8k_Dataset.zip", "0" * 32)
    root = tmp_path / "flickr8k"
    assert main(["data", "flickr8k", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(r"Flickr8k_Dataset.zip: damaged zip \(its MD5 is [0-9a-f]{32}, the published one 0{32}\) again "
                     r"after a fresh download from http://127.0.0.1:\d+/Flickr8k_Dataset.zip", err), err
    assert server.paths().count("/Flickr8k_Dataset.zip") == 2
    assert not (root / "images").exists() and not (root / "dataset_flickr8k.json").exists()
    assert not (root / "downloads" / "Flickr8k_Dataset.zip").exists()
    assert not part_path(root / "downloads" / "Flickr8k_Dataset.zip").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".")]

    monkeypatch.setitem(flickr8k_setup.MD5, "Flickr8k_Dataset.zip", file_md5(server.folder / "Flickr8k_Dataset.zip"))
    assert flickr8k_setup.setup_flickr8k(root)["counts"] == COUNTS
    assert server.paths().count("/Flickr8k_text.zip") == 1       # the text step stood: not fetched again


def test_from_the_two_archives_needs_no_network_and_keeps_them(served, tmp_path, monkeypatch, capsys):
    given = tmp_path / "given"
    shutil.copytree(served, given)
    monkeypatch.setattr(flickr8k_setup, "RELEASE", "http://127.0.0.1:9")        # nothing listens there
    monkeypatch.setattr(flickr8k_setup, "MD5", {path.name: file_md5(path) for path in given.glob("*.zip")})
    root = tmp_path / "flickr8k"
    assert main(["data", "flickr8k", "--root", str(root), "--from", str(given)]) == 0
    assert f"photos: unpacked from {given / 'Flickr8k_Dataset.zip'}" in capsys.readouterr().out
    check_split(root)
    assert sorted(p.name for p in given.iterdir()) == ["Flickr8k_Dataset.zip", "Flickr8k_text.zip"]

    other = tmp_path / "other"
    monkeypatch.setitem(flickr8k_setup.MD5, "Flickr8k_text.zip", "f" * 32)
    assert main(["data", "flickr8k", "--root", str(other), "--from", str(given)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{given / 'Flickr8k_text.zip'}: its MD5 is" in err
    assert "a damaged or different copy of Flickr8k's Flickr8k_text.zip" in err
    assert (given / "Flickr8k_text.zip").is_file() and not (other / "text").exists()


def test_from_the_unpacked_archives(served, tmp_path):
    given = tmp_path / "given"
    for name, below in (("Flickr8k_Dataset.zip", "Flickr8k_Dataset"), ("Flickr8k_text.zip", "Flickr8k_text")):
        with zipfile.ZipFile(served / name) as handle:
            handle.extractall(given / below)
    root = tmp_path / "flickr8k"
    result = flickr8k_setup.setup_flickr8k(root, source=given)
    assert result["steps"] == {"text": f"copied from {given / 'Flickr8k_text'}", "images": "13 photos linked or copied"}
    check_split(root)
    second = flickr8k_setup.setup_flickr8k(root, source=given)
    assert second["outputs"] == "verified" and second["steps"]["images"] == "already in place (verified)"


def test_from_photos_with_a_karpathy_file_takes_its_split(tmp_path, capsys):
    given = tmp_path / "given"
    (given / "images").mkdir(parents=True)
    entries = []
    for k, (name, split) in enumerate([(NAMES[0], "train"), (NAMES[1], "train"), (NAMES[2], "val"), (MISSING, "val")]):
        if name != MISSING:
            (given / "images" / name).write_bytes(jpeg(k))
        entries.append({"filepath": "images", "filename": name, "imgid": k, "split": split,
                        "sentences": [{"raw": c, "sentid": 5 * k + i} for i, c in enumerate(captions(k))],
                        "sentids": list(range(5 * k, 5 * k + 5))})
    entries[1]["sentences"][0]["raw"] = " . "                       # a caption without a word
    (given / "dataset_flickr8k.json").write_text(json.dumps({"dataset": "flickr8k", "images": entries}))
    root = tmp_path / "flickr8k"
    assert main(["data", "flickr8k", "--root", str(root), "--from", str(given)]) == 0
    out = capsys.readouterr().out
    assert "split: train 2 photos (9 captions), val 1 photo (5 captions), test none" in out
    assert f"skipped: 1 listed name without a photo ({MISSING}); 1 caption without a word" in out
    assert "captioner evaluate --checkpoint runs/flickr8k_full_soft_lite2/best.pt --split val" in out  # no test
    data = json.loads((root / "dataset_flickr8k.json").read_text())
    assert [e["filename"] for e in data["images"]] == NAMES[:3]
    assert data["images"][1]["sentids"] == [6, 7, 8, 9] and data["images"][0] == entries[0]
    assert sorted(p.name for p in (root / "images").iterdir()) == sorted(NAMES[:3])
    assert main(["data", "flickr8k", "--root", str(root)]) == 0          # no --from: verified, nothing fetched
    assert "nothing downloaded; everything was in place and verified" in capsys.readouterr().out


def test_a_member_outside_the_folder_and_a_folder_without_flickr8k_are_refused(served, tmp_path, monkeypatch):
    given = tmp_path / "given"
    given.mkdir()
    shutil.copy(served / "Flickr8k_text.zip", given)
    with zipfile.ZipFile(given / "Flickr8k_Dataset.zip", "w") as handle:
        handle.writestr("Flicker8k_Dataset/1000_00c0ffee.jpg", jpeg(0))
        handle.writestr("../escaped.jpg", jpeg(1))
    monkeypatch.setattr(flickr8k_setup, "MD5", {path.name: file_md5(path) for path in given.glob("*.zip")})
    root = tmp_path / "deep" / "flickr8k"
    with pytest.raises(CaptionerError, match=r"Flickr8k_Dataset.zip: member '../escaped.jpg' would be written outside"):
        flickr8k_setup.setup_flickr8k(root, source=given)
    assert not list(tmp_path.rglob("escaped.jpg")) and not (root / "images").exists()
    (tmp_path / "elsewhere" / "photos").mkdir(parents=True)
    with pytest.raises(CaptionerError, match="elsewhere: neither dataset_flickr8k.json, Flickr8k_text.zip nor "
                                             "Flickr8k.token.txt in it"):
        flickr8k_setup.setup_flickr8k(tmp_path / "other", source=tmp_path / "elsewhere")
    with pytest.raises(CaptionerError, match="Flickr8k_text.zip: not a folder"):
        flickr8k_setup.setup_flickr8k(tmp_path / "other", source=served / "Flickr8k_text.zip")


def test_the_prepared_archive_layout_trains_the_full_recipe_and_scores_the_official_test_photos(served, tmp_path):
    given = tmp_path / "given"
    for name in ("Flickr8k_Dataset.zip", "Flickr8k_text.zip"):
        with zipfile.ZipFile(served / name) as handle:
            handle.extractall(given)
    root = tmp_path / "flickr8k"
    assert main(["data", "flickr8k", "--root", str(root), "--from", str(given)]) == 0
    tiny = [f"data.karpathy={root / 'dataset_flickr8k.json'}", f"data.image_root={root}",
            f"data.features={tmp_path / 'features'}", "data.vocab_min_count=1", f"run.out={tmp_path / 'run'}",
            "run.device=cpu", "encoder.pretrained=false", "encoder.image_size=32", "model.lstm.attention_dim=8",
            "model.lstm.embed_dim=8", "model.lstm.hidden_dim=16", "train.epochs=1", "train.batch_size=10",
            "train.amp=false", "decode.max_length=8"]
    result = train(load_config(recipes()["flickr8k_full_soft"], tiny), progress=False)
    assert result["epochs"] == 1 and result["step"] == 3                 # 30 captions of 6 photos, 10 a step
    scores = evaluate_checkpoint(result["checkpoint"], split="test", progress=False, device="cpu")
    assert scores["images"] == 2 and scores["unreadable_images"] == []
    test = json.loads((tmp_path / "run" / "captions_test.json").read_text())
    assert sorted(c["image_id"] for c in test) == [9, 10]               # the two captioned test photos' imgids
    references = json.loads((root / "annotations" / "captions_test.json").read_text())
    assert {a["image_id"] for a in references["annotations"]} == {9, 10}    # what pycocoevalcap would score against
