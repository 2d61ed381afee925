"""A full-scale COCO rehearsal on this machine, printed as JSON: a tree shaped like MS-COCO 2014 at its real
count (123,287 images, 616,767 captions) pushed through the real command line, stage by stage, at several
scales, with each stage's time and peak memory, so that no stage can hide a cost that grows faster than the
number of images.

The tree, generated once per scale under ``--dir`` and reused by later runs (a stamp names what made it):
``train2014/COCO_train2014_%012d.jpg`` and ``val2014/COCO_val2014_%012d.jpg`` (32 x 32 JPEGs of a few
patterns: one or two coloured objects of 8 COCO categories in the image's quadrants; a smaller scale's images
are a subset of a larger one's, shared in ``--dir/images``), ``annotations/captions_{train,val}2014.json`` and
``annotations/instances_val2014.json`` (boxes and polygons) in the official format, and the Karpathy split file
``dataset_coco.json`` (5,000 val and 5,000 test images of val2014 at full scale, proportionally fewer below it;
the rest restval and train). Captions name the objects, their colour and place, then add words drawn from a
Zipf law over a lexicon of 30,000 words (11 words a caption at the median; at full scale 9,422 words are seen 5
times or more, as in COCO).

Each stage runs the real ``captioner`` command in a fresh process (``configs/coco_soft.yaml`` with the tree's
paths and a tiny model: the ImageNet MobileNetV2 of the offline weights package at 32 px, stride 16, a 2 x 2 grid
of 96 features; an LSTM of 64 units with a learning rate of 3e-3 and captions of at least 4 words, so that a
minute of training names the objects that grounding looks for), so that its memory is its own:

1. ``read_coco``: ``captioner data vocab`` through the official-format reader (captions_train2014.json);
   ``read_karpathy``: the same through the Karpathy reader (the vocabulary the later stages use);
2. ``cache``: ``captioner cache-features --splits train val test`` (2 DataLoader workers);
3. ``train``: ``captioner train`` from the cache (``data.bucket_by_length=true``, 2 workers, ``train.log_every=1``):
   the time from the process's start to its first training step (the first record of ``metrics.jsonl``), then
   SIGTERM after ``--train-seconds`` (a resumable ``last.pt``, exit status 130); ``train_resume``: ``--resume``,
   checked to continue at the saved step + 1, its time to the first step, stopped the same way;
4. ``evaluate``: ``captioner evaluate --checkpoint RUN/last.pt --split test`` (Java: PTB tokenizer and METEOR);
5. ``ground``: ``captioner ground --checkpoint RUN/last.pt --split test --instances instances_val2014.json``.

Memory: the process tree of each stage (the command, its DataLoader workers, Java) is read from /proc every
0.1 s: the peak of the summed resident sets (RSS; pages that forked workers share count in every process that
maps them, so this is an upper bound) and of the summed proportional sets (PSS, shared pages divided among their
processes); also the exact peak of the largest single process (``wait4``'s ``ru_maxrss``, reaped children
included). CPU seconds (user + system) of the whole tree come with each wall time. Targets checked: every stage's
peak tree RSS (and PSS) under 4 GB, the first training step within 2 minutes of ``captioner train`` starting
(fresh and resumed), and each stage's CPU seconds per 1,000 images growing by at most 1.5x from the smallest scale
to the largest (CPU time, which other work on a shared machine disturbs far less than wall time; both are
reported, with the marginal cost between scales). Training is counted to its first step.

    python benchmarks/bench_coco_scale.py [--quick] [--threads N] [--scales 10000 40000 123287] [--dir /tmp/coco_scale] [--train-seconds 45] [--workers 2] [--clean] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import add_arguments
from PIL import Image

from captioner.core.devices import cpu_model
from captioner.results.record import report

ROOT = Path(__file__).resolve().parent.parent
FULL_IMAGES, FULL_TRAIN, FULL_CAPTIONS, FULL_EVAL = 123_287, 82_783, 616_767, 5_000
SCALES = (10_000, 40_000, FULL_IMAGES)
GENERATOR = 1                       # bumped when the tree's contents change: older trees are made again
RSS_TARGET_MB, FIRST_STEP_TARGET_S, GROWTH_LIMIT = 4096, 120.0, 1.5
SAMPLE_S = 0.1

# (category, colour name, RGB, the words captions use for it): all in captioner.evaluation.coco_words
OBJECTS = (("dog", "brown", (140, 90, 40), ("dog", "puppy")), ("cat", "grey", (128, 128, 128), ("cat", "kitten")),
           ("car", "red", (210, 30, 30), ("car", "taxi")), ("bus", "yellow", (230, 200, 20), ("bus",)),
           ("person", "blue", (40, 70, 210), ("man", "woman", "person")), ("pizza", "orange", (240, 140, 20), ("pizza",)),
           ("horse", "black", (20, 20, 20), ("horse", "pony")), ("bird", "white", (240, 240, 240), ("bird",)))
QUADRANTS = (("top left", (0, 0)), ("top right", (16, 0)), ("bottom left", (0, 16)), ("bottom right", (16, 16)))
VARIANTS = 4                        # noise backgrounds per pattern
COMMON_WORDS = (
    "a an the of on in with and is are at to near next by some two three its his her their while for from up down "
    "sitting standing walking riding holding looking playing eating lying parked flying running waiting driving "
    "street table field road grass water building room window wall floor city park beach snow tree trees sky "
    "top side front back middle open large small big little old young white black green red blue wooden tall "
    "other couple group people plate food board sign light train bench kitchen bathroom desk picture photo view "
    "area air ocean hill wave fence track ground yard shore dirt outside inside day night together each another "
    "over under behind around across through along into onto very several many few one has have there this that "
    "who which what being doing covered filled made full empty cut fresh sliced topped colorful brick stone metal "
    "glass paper plastic cloth shirt hat jacket dress pants shoes bag ball frisbee kite umbrella bike skateboard "
    "surfboard skis snowboard racket bat glove phone laptop computer television book clock vase bowl cup bottle "
    "chair couch bed sink toilet mirror door counter shelf plant flowers fruit vegetables sandwich cake donut "
    "banana apple broccoli carrot hot dog sheep cow elephant bear zebra giraffe truck boat airplane motorcycle "
    "bicycle traffic fire hydrant stop parking meter person men women kids children boy girl baby player team "
    "game match court stadium crowd tennis baseball soccer skiing surfing skating jumping swinging throwing "
    "catching hitting watching talking smiling posing wearing carrying pulling pushing cutting cooking").split()


# ------------------------------------------------------------------------------------------------------
# The tree

def scale_counts(images: int) -> dict:
    """Images, captions and Karpathy split sizes of a tree of ``images`` images, COCO's shares kept."""
    train = round(images * FULL_TRAIN / FULL_IMAGES)
    evaluation = max(1, round(FULL_EVAL * images / FULL_IMAGES))
    return {"images": images, "train2014": train, "val2014": images - train, "karpathy_val": evaluation,
            "karpathy_test": evaluation, "captions": round(FULL_CAPTIONS * images / FULL_IMAGES)}


def full_layout() -> dict:
    """Every image of the full tree in a fixed random order per folder (a scale takes the first ones): ids,
    the pattern drawn (objects, quadrants, noise variant)."""
    rng = np.random.default_rng(2014)
    ids = rng.choice(np.arange(1, 600_000), size=FULL_IMAGES, replace=False)
    objects = rng.integers(0, len(OBJECTS), size=(FULL_IMAGES, 2))
    quadrants = np.stack([rng.integers(0, 4, FULL_IMAGES), rng.integers(0, 3, FULL_IMAGES)], axis=1)
    quadrants[:, 1] = (quadrants[:, 0] + 1 + quadrants[:, 1]) % 4          # the second object elsewhere
    two = rng.random(FULL_IMAGES) < 0.3
    return {"train2014": slice(0, FULL_TRAIN), "val2014": slice(FULL_TRAIN, FULL_IMAGES), "ids": ids,
            "objects": objects, "quadrants": quadrants, "two": two, "variant": rng.integers(0, VARIANTS, FULL_IMAGES)}


def pattern_jpegs() -> dict[tuple, bytes]:
    """The JPEG bytes of every pattern: ``(object, quadrant, variant)`` and ``(object, quadrant, object2,
    quadrant2, variant)``."""
    rng = np.random.default_rng(0)
    backgrounds = [rng.integers(60, 150, size=(32, 32, 3), dtype=np.uint8) for _ in range(VARIANTS)]
    out = {}

    def encode(pixels: np.ndarray) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        return buffer.getvalue()

    for v, background in enumerate(backgrounds):
        for o, (_, _, rgb, _) in enumerate(OBJECTS):
            for q, (_, (x, y)) in enumerate(QUADRANTS):
                pixels = background.copy()
                pixels[y + 2 : y + 14, x + 2 : x + 14] = rgb
                out[(o, q, v)] = encode(pixels)
                for o2, (_, _, rgb2, _) in enumerate(OBJECTS):
                    for q2, (_, (x2, y2)) in enumerate(QUADRANTS):
                        if q2 != q:
                            both = pixels.copy()
                            both[y2 + 2 : y2 + 14, x2 + 2 : x2 + 14] = rgb2
                            out[(o, q, o2, q2, v)] = encode(both)
    return out


def file_name(folder: str, image_id: int) -> str:
    return f"COCO_{folder}_{image_id:012d}.jpg"


def ensure_images(pool: Path, layout: dict, counts: dict) -> int:
    """Write the JPEGs of the first ``counts[folder]`` images of each folder into ``pool`` that are not there yet
    (a stamp per folder holds how many are); returns the number written."""
    written, jpegs = 0, None
    for folder in ("train2014", "val2014"):
        stamp = pool / f"{folder}.count"
        have = int(stamp.read_text()) if stamp.exists() else 0
        need = counts[folder]
        if need <= have:
            continue
        jpegs = jpegs or pattern_jpegs()
        (pool / folder).mkdir(parents=True, exist_ok=True)
        first = layout[folder].start
        for k in range(first + have, first + need):
            o1, o2 = layout["objects"][k]
            q1, q2 = layout["quadrants"][k]
            key = (o1, q1, o2, q2, layout["variant"][k]) if layout["two"][k] else (o1, q1, layout["variant"][k])
            with open(pool / folder / file_name(folder, int(layout["ids"][k])), "wb") as handle:
                handle.write(jpegs[tuple(int(v) for v in key)])
            written += 1
        stamp.write_text(str(need))
    return written


def lexicon(size: int = 30_000) -> list[str]:
    """Common caption words first, then made-up words of two or three syllables, most frequent first."""
    rng = np.random.default_rng(1)
    onsets = "b c d f g h j k l m n p r s t v w z br ch cl dr fl gr pl sh st tr".split()
    vowels = "a e i o u ai ea ou".split()
    codas = ["", "", "n", "r", "l", "s", "t", "m", "nd", "st"]
    words, seen = list(dict.fromkeys(COMMON_WORDS)), set(COMMON_WORDS)
    while len(words) < size:
        syllables = rng.integers(2, 4)
        word = "".join(onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))] for _ in range(syllables))
        word += codas[rng.integers(len(codas))]
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def make_captions(layout: dict, indices: np.ndarray, per_image: np.ndarray, seed: int) -> list[list[str]]:
    """``per_image[i]`` captions of image ``indices[i]``: its objects, colours and places, then Zipf words."""
    rng = np.random.default_rng(seed)
    words = lexicon()
    ranks = np.arange(1, len(words) + 1)
    zipf = ranks ** -1.3
    total = int(per_image.sum())
    fillers = rng.integers(2, 7, size=total)
    drawn = iter(rng.choice(len(words), size=int(fillers.sum()), p=zipf / zipf.sum()).tolist())
    choice = rng.integers(0, 1 << 30, size=(total, 4)).tolist()
    out, c = [], 0
    for k, count in zip(indices.tolist(), per_image.tolist()):
        (o1, o2), (q1, _), two = layout["objects"][k].tolist(), layout["quadrants"][k].tolist(), bool(layout["two"][k])
        captions = []
        for _ in range(count):
            a, b, d, e = choice[c]
            _, colour, _, names = OBJECTS[o1]
            name = names[a % len(names)]
            where = QUADRANTS[q1][0]
            head = (f"A {colour} {name} in the {where} corner" if b % 3 == 0 else
                    f"There is a {name} at the {where}" if b % 3 == 1 else f"A {colour} {name} {where}")
            if two and d % 2 == 0:
                other = OBJECTS[o2][3][e % len(OBJECTS[o2][3])]
                head += f" next to a {OBJECTS[o2][1]} {other}"
            tail = " ".join(words[next(drawn)] for _ in range(fillers[c]))
            captions.append(f"{head} {tail}" + ("." if e % 4 else ""))
            c += 1
        out.append(captions)
    return out


def tokens_of(caption: str) -> list[str]:
    return caption.lower().rstrip(".").split()


def write_json_stream(path: Path, head: str, items, tail: str) -> None:
    """``head`` + the items as a JSON array's elements + ``tail``, written as it goes (no second copy in memory)."""
    with open(path, "w") as handle:
        handle.write(head)
        for n, item in enumerate(items):
            handle.write((", " if n else "") + json.dumps(item))
        handle.write(tail)


def generate_tree(tree: Path, pool: Path, images: int) -> dict:
    """The tree of ``images`` images in ``tree`` (images in the shared ``pool``), unless its stamp says it is
    there already; returns what it holds and how long it took."""
    stamp_path = tree / "stamp.json"
    counts = scale_counts(images)
    wanted = {"generator": GENERATOR, **counts}
    if stamp_path.exists() and json.loads(stamp_path.read_text()).get("generator_settings") == wanted:
        return {**json.loads(stamp_path.read_text()), "reused": True}
    started = time.perf_counter()
    if tree.exists():
        shutil.rmtree(tree)
    (tree / "annotations").mkdir(parents=True)
    layout = full_layout()
    written = ensure_images(pool, layout, counts)
    for folder in ("train2014", "val2014"):
        (tree / folder).symlink_to(pool / folder, target_is_directory=True)
    rng = np.random.default_rng(images)
    folders = {folder: np.arange(layout[folder].start, layout[folder].start + counts[folder]) for folder in ("train2014", "val2014")}
    per_image = np.full(images, 5)
    per_image[rng.choice(images, size=counts["captions"] - 5 * images, replace=False)] += 1
    captions = make_captions(layout, np.concatenate(list(folders.values())), per_image, seed=images)
    by_folder = {"train2014": captions[: counts["train2014"]], "val2014": captions[counts["train2014"] :]}
    date = "2013-11-14 16:28:13"
    info = {"description": "COCO-shaped rehearsal tree (synthetic)", "version": "1.0", "year": 2014,
            "contributor": "benchmarks/bench_coco_scale.py", "date_created": "2015-01-27 09:11:52.357475"}
    licenses = [{"url": "http://creativecommons.org/licenses/by-nc-sa/2.0/", "id": 1,
                 "name": "Attribution-NonCommercial-ShareAlike License"}]
    annotation_id = 1
    for folder, indices in folders.items():
        ids = layout["ids"][indices].tolist()
        image_entries = [{"license": 1, "file_name": file_name(folder, i), "coco_url": "", "height": 32, "width": 32,
                          "date_captured": date, "flickr_url": "", "id": i} for i in ids]
        annotations = []
        for image_id, texts in zip(ids, by_folder[folder]):
            for text in texts:
                annotations.append({"image_id": image_id, "id": annotation_id, "caption": text})
                annotation_id += 1
        split = folder[:-4]
        with open(tree / "annotations" / f"captions_{split}2014.json", "w") as handle:
            json.dump({"info": info, "images": image_entries, "licenses": licenses, "annotations": annotations}, handle)
        if folder == "val2014":
            write_instances(tree / "annotations" / "instances_val2014.json", layout, indices, image_entries, info, licenses)
    write_karpathy(tree / "dataset_coco.json", layout, folders, by_folder, counts)
    stamp = {"generator_settings": wanted, "images_written": written, "generate_s": round(time.perf_counter() - started, 1),
             "annotations_mb": {p.name: round(p.stat().st_size / 1e6, 1) for p in sorted((tree / "annotations").iterdir())},
             "karpathy_mb": round((tree / "dataset_coco.json").stat().st_size / 1e6, 1)}
    stamp_path.write_text(json.dumps(stamp))
    return {**stamp, "reused": False}


def write_instances(path: Path, layout: dict, indices: np.ndarray, image_entries: list, info: dict, licenses: list) -> None:
    """COCO instances: one box and rectangle polygon per object of each val image, the 80 categories."""
    from captioner.evaluation.coco_words import CATEGORY_WORDS

    category_id = {name: n + 1 for n, name in enumerate(CATEGORY_WORDS)}
    categories = [{"supercategory": "object", "id": category_id[name], "name": name} for name in CATEGORY_WORDS]
    annotations, annotation_id = [], 1
    for k, image in zip(indices.tolist(), image_entries):
        objects = [(layout["objects"][k][0], layout["quadrants"][k][0])]
        if layout["two"][k]:
            objects.append((layout["objects"][k][1], layout["quadrants"][k][1]))
        for o, q in objects:
            x, y = QUADRANTS[int(q)][1]
            x0, y0, x1, y1 = x + 2, y + 2, x + 14, y + 14
            annotations.append({"segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]], "area": 144.0, "iscrowd": 0,
                                "image_id": image["id"], "bbox": [x0, y0, 12, 12],
                                "category_id": category_id[OBJECTS[int(o)][0]], "id": annotation_id})
            annotation_id += 1
    with open(path, "w") as handle:
        json.dump({"info": info, "images": image_entries, "licenses": licenses, "annotations": annotations,
                   "categories": categories}, handle)


def write_karpathy(path: Path, layout: dict, folders: dict, by_folder: dict, counts: dict) -> None:
    """``dataset_coco.json`` as Karpathy's: val2014 first (its first images val, then test, the rest restval),
    then train2014; tokens, raw sentences, imgid and sentid as in the original."""
    def entries():
        imgid = sentid = 0
        for folder in ("val2014", "train2014"):
            for n, (k, texts) in enumerate(zip(folders[folder].tolist(), by_folder[folder])):
                if folder == "train2014":
                    split = "train"
                else:
                    split = ("val" if n < counts["karpathy_val"] else
                             "test" if n < counts["karpathy_val"] + counts["karpathy_test"] else "restval")
                image_id = int(layout["ids"][k])
                sentences = [{"tokens": tokens_of(t), "raw": t, "imgid": imgid, "sentid": sentid + j}
                             for j, t in enumerate(texts)]
                yield {"filepath": folder, "sentids": list(range(sentid, sentid + len(texts))),
                       "filename": file_name(folder, image_id), "imgid": imgid, "split": split,
                       "sentences": sentences, "cocoid": image_id}
                imgid += 1
                sentid += len(texts)

    write_json_stream(path, '{"images": [', entries(), '], "dataset": "coco"}')


# ------------------------------------------------------------------------------------------------------
# Running a stage and watching its process tree

def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (of every thread of it)."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(p) for p in handle.read().split()]
    except OSError:
        pass
    return found


def tree_of(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children(p)
    return out


TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int, reaped: bool = False) -> float:
    """User + system CPU seconds of ``pid`` (with ``reaped``: plus those of its children it has waited for)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return ticks / TICKS


def process_memory_kb(pid: int) -> tuple[int, int, int] | None:
    """``(VmRSS, VmHWM, Pss)`` of ``pid`` in kB, or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    pss = re.search(r"^Pss:\s+(\d+)", rollup, flags=re.M)
    try:
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0]), int(pss.group(1)) if pss else 0
    except (KeyError, ValueError):   # a zombie has no VmRSS
        return None


class Stage:
    """One command in a fresh process, its output in ``folder/name.{out,err}``, its tree's memory sampled."""

    def __init__(self, name: str, command: list[str], folder: Path, env: dict):
        self.name, self.command = name, command
        self.out_path, self.err_path = folder / f"{name}.out", folder / f"{name}.err"
        self.peak = {"tree_rss_kb": 0, "tree_pss_kb": 0, "main_hwm_kb": 0, "processes": 0}
        self.started = time.perf_counter()
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=ROOT)
        self.returncode, self.ru_maxrss_kb, self.cpu_s = None, 0, 0.0

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def sample(self) -> None:
        rss = pss = count = 0
        pids = tree_of(self.process.pid)
        self.cpu_s = sum(process_cpu_s(pid, reaped=pid == self.process.pid) for pid in pids)
        for pid in pids:
            memory = process_memory_kb(pid)
            if memory is None:
                continue
            rss, pss, count = rss + memory[0], pss + memory[2], count + 1
            if pid == self.process.pid:
                self.peak["main_hwm_kb"] = max(self.peak["main_hwm_kb"], memory[1])
        self.peak["tree_rss_kb"] = max(self.peak["tree_rss_kb"], rss)
        self.peak["tree_pss_kb"] = max(self.peak["tree_pss_kb"], pss)
        self.peak["processes"] = max(self.peak["processes"], count)

    def poll(self) -> bool:
        """Sample, and reap the process when it has ended (``wait4``: its exact peak RSS); True once ended."""
        if self.returncode is not None:
            return True
        self.sample()
        pid, status, usage = os.wait4(self.process.pid, os.WNOHANG)
        if pid == 0:
            return False
        self.seconds = self.elapsed
        self.returncode = self.process.returncode = os.waitstatus_to_exitcode(status)
        self.ru_maxrss_kb = usage.ru_maxrss
        self.cpu_s = usage.ru_utime + usage.ru_stime        # the whole tree's, reaped children included
        return True

    def wait(self, watch=None, timeout: float = 3600.0) -> "Stage":
        """Poll every 0.1 s until the process ends, calling ``watch(self)`` in between; killed after ``timeout``."""
        while not self.poll():
            if watch is not None:
                watch(self)
            if self.elapsed > timeout:
                self.process.kill()
            time.sleep(SAMPLE_S)
        return self

    def stdout(self) -> str:
        return self.out_path.read_text()

    def summary(self, images: int, **counts) -> dict:
        return {"seconds": round(self.seconds, 2), "cpu_seconds": round(self.cpu_s, 2), "images": images,
                "seconds_per_1k_images": round(self.seconds / images * 1000, 3),
                "cpu_seconds_per_1k_images": round(self.cpu_s / images * 1000, 3),
                "peak_rss_mb": round(self.peak["tree_rss_kb"] / 1024), "peak_pss_mb": round(self.peak["tree_pss_kb"] / 1024),
                "peak_single_process_rss_mb": round(max(self.ru_maxrss_kb, self.peak["main_hwm_kb"]) / 1024),
                "processes": self.peak["processes"], "exit_status": self.returncode, **counts}


def check(stage: Stage, expected: tuple[int, ...] = (0,)) -> Stage:
    if stage.returncode not in expected:
        tail = stage.err_path.read_text()[-3000:]
        raise RuntimeError(f"{stage.name} exited with {stage.returncode} (expected {expected}): "
                           f"{' '.join(stage.command)}\n{tail}")
    return stage


def last_json(text: str) -> dict:
    """The JSON object a command printed last (pretty-printed over several lines or on one)."""
    start = text.rfind("\n{")
    return json.loads(text[start + 1 if start >= 0 else text.index("{"):])


class TrainWatch:
    """Watches ``metrics.jsonl`` for the first training record written after the start, then stops the run
    with SIGTERM ``seconds`` later (or at ``give_up`` seconds when no step came)."""

    def __init__(self, metrics: Path, seconds: float, give_up: float = 900.0):
        self.metrics, self.seconds, self.give_up = metrics, seconds, give_up
        self.offset = metrics.stat().st_size if metrics.exists() else 0
        self.first_step_s = self.first_step_cpu_s = self.first_step = self.last_step = self.stop_sent_s = None
        self.partial = b""

    def __call__(self, stage: Stage) -> None:
        if self.metrics.exists():
            with open(self.metrics, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
            self.offset += len(data)
            lines = (self.partial + data).split(b"\n")
            self.partial = lines.pop()
            for line in lines:
                record = json.loads(line)
                if record.get("type") == "train":
                    if self.first_step_s is None:
                        self.first_step_s, self.first_step, self.first_step_cpu_s = stage.elapsed, record["step"], stage.cpu_s
                    self.last_step = record["step"]
        due = self.first_step_s + self.seconds if self.first_step_s is not None else self.give_up
        if self.stop_sent_s is None and stage.elapsed >= due:
            stage.process.send_signal(signal.SIGTERM)
            self.stop_sent_s = stage.elapsed
        elif self.stop_sent_s is not None and stage.elapsed > self.stop_sent_s + 300:
            stage.process.kill()


# ------------------------------------------------------------------------------------------------------
# One scale

def overrides(tree: Path, workers: int) -> list[str]:
    """``configs/coco_soft.yaml`` pointed at ``tree``, with a tiny random-init encoder and model."""
    instances = str(tree / "annotations" / "instances_val2014.json")
    return [f"data.karpathy={tree / 'dataset_coco.json'}", f"data.image_root={tree}", f"data.features={tree / 'features'}",
            f"data.vocab={tree / 'vocab.json'}", f"data.instances={json.dumps({'val': instances, 'test': instances})}",
            f"data.num_workers={workers}", "data.bucket_by_length=true", "run.device=cpu", f"run.out={tree / 'run'}",
            "encoder.name=mobilenet_v2", "encoder.pretrained=true", "encoder.image_size=32", "encoder.stride=16",
            "model.lstm.attention_dim=32", "model.lstm.embed_dim=32", "model.lstm.hidden_dim=64",
            "train.log_every=1", "train.wandb=disabled", "train.epochs=100", "train.early_stopping=0",
            "train.lr=0.003",         # so that a minute of training learns to name the objects, at every scale
            "decode.min_length=4"]    # ... and does not rank the empty caption first


def run_scale(images: int, root: Path, args, env: dict) -> dict:
    started = time.perf_counter()
    tree = root / f"coco_{images}"
    generated = generate_tree(tree, root / "images", images)
    counts = scale_counts(images)
    for stale in ("features", "run", "vocab.json", "vocab_official.json", "logs"):
        path = tree / stale
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    logs = tree / "logs"
    logs.mkdir()
    captioner = [sys.executable, "-m", "captioner"]
    config = [str(ROOT / "configs" / "coco_soft.yaml"), *overrides(tree, args.workers)]
    stages = {}

    def log(text: str) -> None:
        print(f"[{images}] {text}", file=sys.stderr, flush=True)

    official = [f"data.captions={json.dumps({'train': str(tree / 'annotations' / 'captions_train2014.json')})}",
                f"data.images={json.dumps({'train': str(tree / 'train2014')})}", "data.format=coco"]
    stage = check(Stage("read_coco", captioner + ["data", "vocab", *config, *official, "--out",
                                                  str(tree / "vocab_official.json")], logs, env).wait())
    report = last_json(stage.stdout())
    stages["read_coco"] = stage.summary(counts["train2014"], captions=report["train_captions"], vocabulary=report["words"],
                                        file="captions_train2014.json")
    log(f"read_coco {stage.seconds:.1f} s")
    stage = check(Stage("read_karpathy", captioner + ["data", "vocab", *config], logs, env).wait())
    report = last_json(stage.stdout())
    stages["read_karpathy"] = stage.summary(images - counts["karpathy_val"] - counts["karpathy_test"],
                                            captions=report["train_captions"], vocabulary=report["words"],
                                            distinct_words=report["distinct_train_words"],
                                            caption_length_p50_p95_max=report["caption_length_p50_p95_max"])
    log(f"read_karpathy {stage.seconds:.1f} s")

    stage = check(Stage("cache", captioner + ["cache-features", *config, "--splits", "train", "val", "test"], logs, env).wait())
    written = re.search(r"(\d+) images written", stage.stdout())
    cache_mb = sum(p.stat().st_size for p in (tree / "features").iterdir()) / 1e6
    stages["cache"] = stage.summary(images, written=int(written.group(1)) if written else None, cache_mb=round(cache_mb, 1))
    log(f"cache {stage.seconds:.1f} s")

    metrics = tree / "run" / "metrics.jsonl"
    vocabulary = stages["read_karpathy"]["vocabulary"]     # what each training step and decoding step costs grows with it
    for name, extra, seconds in (("train", [], args.train_seconds), ("train_resume", ["--resume"], args.resume_seconds)):
        watch = TrainWatch(metrics, seconds)
        stage = check(Stage(name, captioner + ["train", *config, "--no-wandb", *extra], logs, env).wait(watch), (130, 0))
        result = last_json(stage.stdout())
        ended = watch.stop_sent_s if watch.stop_sent_s is not None else stage.seconds   # or it finished by itself
        summary = stage.summary(images, first_step_s=round(watch.first_step_s, 2) if watch.first_step_s else None,
                                first_step=watch.first_step, last_step=result["step"],
                                steps_per_s=round((watch.last_step - watch.first_step) / max(ended - watch.first_step_s, 1e-9), 2)
                                if watch.first_step_s else None,
                                stop_to_exit_s=round(stage.seconds - watch.stop_sent_s, 2) if watch.stop_sent_s else None,
                                stopped=result["stopped"], epochs=result["epochs"], vocabulary=vocabulary)
        if watch.first_step_s:
            summary.update(first_step_cpu_s=round(watch.first_step_cpu_s, 2),
                           first_step_s_per_1k_images=round(watch.first_step_s / images * 1000, 3),
                           first_step_cpu_s_per_1k_images=round(watch.first_step_cpu_s / images * 1000, 3))
        if name == "train_resume":
            summary["resumed_at_saved_step_plus_1"] = watch.first_step == stages["train"]["last_step"] + 1
        stages[name] = summary
        log(f"{name}: first step after {watch.first_step_s} s, stopped at step {result['step']}")

    checkpoint = str(tree / "run" / "last.pt")
    stage = check(Stage("evaluate", captioner + ["evaluate", "--checkpoint", checkpoint, "--split", "test",
                                                 "--device", "cpu"], logs, env).wait())
    scores = last_json(stage.stdout())
    stages["evaluate"] = stage.summary(counts["karpathy_test"], decoded=scores["images"], vocabulary=vocabulary,
                                       **{k: round(scores[k], 4) for k in ("BLEU-4", "METEOR", "CIDEr") if k in scores},
                                       pointing_accuracy=scores.get("pointing_accuracy"))
    log(f"evaluate {stage.seconds:.1f} s")
    instances = tree / "annotations" / "instances_val2014.json"
    stage = check(Stage("ground", captioner + ["ground", "--checkpoint", checkpoint, "--split", "test",
                                               "--instances", str(instances), "--json", "--device", "cpu"],
                        logs, env).wait())
    grounding = last_json(stage.stdout())
    stages["ground"] = stage.summary(counts["karpathy_test"], images_grounded=grounding["images_grounded"], vocabulary=vocabulary,
                                     words=grounding["words"], pointing_accuracy=round(grounding["pointing_accuracy"], 4),
                                     uniform_pointing=round(grounding["uniform_pointing"], 4))
    log(f"ground {stage.seconds:.1f} s")
    return {"images": images, "counts": counts, "tree": {k: v for k, v in generated.items() if k != "generator_settings"},
            "stages": stages, "scale_seconds": round(time.perf_counter() - started, 1)}


# ------------------------------------------------------------------------------------------------------
# Machine facts and targets

def machine() -> dict:
    import torch

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = set((re.search(r"^flags\s*:\s*(.*)$", cpuinfo, flags=re.M) or re.match("()", "")).group(1).split())
    speed = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
    memory = re.search(r"^MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text(), flags=re.M)
    return {"cpu": cpu_model(),
            "cpu_flags": [f for f in speed if f in flags], "cpu_flags_absent": [f for f in speed if f not in flags],
            "logical_cpus": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "memory_gb": round(int(memory.group(1)) / 2**20, 1) if memory else None,
            "torch": torch.__version__, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "numpy": np.__version__, "python": platform.python_version(), "java": shutil.which("java") is not None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_average_at_start": [round(v, 2) for v in os.getloadavg()]}


def targets(runs: list[dict]) -> dict:
    """The acceptance targets, and how each stage's cost per 1,000 images grows from the smallest scale to the
    largest: in wall seconds and in CPU seconds (user + system of the whole process tree, which other work on
    a shared machine disturbs far less; the flag is on these), and the marginal cost (the extra wall seconds per
    extra 1,000 images from one scale to the next). Training counts to its first step."""
    stages = [(run["images"], name, stage) for run in runs for name, stage in run["stages"].items()]
    over_rss = [[images, name, stage["peak_rss_mb"]] for images, name, stage in stages if stage["peak_rss_mb"] >= RSS_TARGET_MB]
    over_pss = [[images, name, stage["peak_pss_mb"]] for images, name, stage in stages if stage["peak_pss_mb"] >= RSS_TARGET_MB]
    first_steps = {f"{images} {name}": stage["first_step_s"] for images, name, stage in stages if name.startswith("train")}
    out = {"peak_rss_under_4gb": not over_rss, "over_4gb_rss": over_rss, "peak_pss_under_4gb": not over_pss,
           "over_4gb_pss": over_pss,
           "first_step_within_2_min": all(s is not None and s <= FIRST_STEP_TARGET_S for s in first_steps.values()),
           "first_step_s": first_steps, "resumed_at_saved_step": all(run["stages"]["train_resume"]["resumed_at_saved_step_plus_1"]
                                                                      for run in runs)}
    if len(runs) < 2:
        return out
    growth, flagged = {}, []
    for name in runs[0]["stages"]:
        wall, cpu = ("first_step_s", "first_step_cpu_s") if name.startswith("train") else ("seconds", "cpu_seconds")
        if any(run["stages"][name].get(wall) is None for run in runs):
            continue    # a training run without a step: reported under first_step_within_2_min
        per_1k = {kind: [round(run["stages"][name][key] / run["stages"][name]["images"] * 1000, 3) for run in runs]
                  for kind, key in (("wall", wall), ("cpu", cpu))}
        marginal = [round((b["stages"][name][wall] - a["stages"][name][wall])
                          / max(b["stages"][name]["images"] - a["stages"][name]["images"], 1) * 1000, 3)
                    for a, b in zip(runs, runs[1:])]
        ratio = {kind: round(values[-1] / values[0], 2) if values[0] else None for kind, values in per_1k.items()}
        growth[name] = {"measure": wall, "s_per_1k_images": per_1k["wall"], "cpu_s_per_1k_images": per_1k["cpu"],
                        "growth": ratio["wall"], "cpu_growth": ratio["cpu"], "marginal_s_per_1k_images": marginal,
                        "peak_rss_mb": [run["stages"][name]["peak_rss_mb"] for run in runs],
                        "peak_pss_mb": [run["stages"][name]["peak_pss_mb"] for run in runs]}
        if ratio["cpu"] is not None and ratio["cpu"] > GROWTH_LIMIT:
            flagged.append(name)
    out.update(scales=[run["images"] for run in runs], growth=growth, super_linear=flagged,
               roughly_linear=not flagged)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, device=False)
    parser.add_argument("--scales", type=int, nargs="+", help=f"tree sizes in images (default {' '.join(map(str, SCALES))}; "
                        "--quick: 500); at most the full 123,287")
    parser.add_argument("--dir", help="where the trees are generated and kept (default /tmp/coco_scale; --quick: a "
                        "temporary folder, deleted afterwards)")
    parser.add_argument("--train-seconds", type=float, default=None, help="training time after the first step before "
                        "SIGTERM (default 45; --quick 5); the resumed run gets a third of it")
    parser.add_argument("--workers", type=int, default=2, help="data.num_workers of cache-features and train (default 2)")
    parser.add_argument("--clean", action="store_true", help="delete --dir afterwards (default: keep the trees for "
                        "the next run)")
    args = parser.parse_args()
    scales = sorted(args.scales or ([500] if args.quick else SCALES))
    if scales[-1] > FULL_IMAGES or scales[0] < 50:
        parser.error(f"--scales: from 50 to {FULL_IMAGES} images")
    args.train_seconds = args.train_seconds if args.train_seconds is not None else (5.0 if args.quick else 45.0)
    args.resume_seconds = max(args.train_seconds / 3, 2.0)
    temporary = args.dir is None and args.quick
    root = Path(tempfile.mkdtemp(prefix="coco_scale_") if temporary else args.dir or "/tmp/coco_scale")
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads)}
    result = {"benchmark": "coco_scale", "machine": {**machine(), "threads": args.threads,
                                                     "note": "other work may share this machine's cores"},
              "memory_method": ("every 0.1 s: the process tree of the stage (the command, DataLoader workers, Java) read "
                                "from /proc/PID/task/*/children; peak_rss_mb: the peak of the summed VmRSS (shared "
                                "copy-on-write pages counted once per process); peak_pss_mb: of the summed Pss "
                                "(/proc/PID/smaps_rollup); peak_single_process_rss_mb: the largest single process's exact "
                                "peak (os.wait4 ru_maxrss, reaped children included, and VmHWM)"),
              "settings": {"train_seconds": args.train_seconds, "resume_seconds": args.resume_seconds,
                           "workers": args.workers, "config": "configs/coco_soft.yaml + " + " ".join(
                               o for o in overrides(Path("TREE"), args.workers))},
              "runs": []}
    try:
        for images in scales:
            result["runs"].append(run_scale(images, root, args, env))
    finally:
        if args.clean or temporary:
            shutil.rmtree(root, ignore_errors=True)
    result["machine"]["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    result["targets"] = targets(result["runs"])
    report("coco_scale", result, configs=["coco_soft"], probes=["text", "data coco_soft"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
