"""Why does self-critical training lose on real photos? Finished runs side by side: cross-entropy starts and the
SCST runs made from them, each trained by ``captioner train`` with the overrides its ``config.yaml`` records against
its recipe: on the quick subset ``flickr8k_soft`` for cross-entropy and ``flickr8k_soft_scst`` for SCST, on the full
Flickr8k (``--study full``) ``flickr8k_full_soft`` and ``flickr8k_full_soft_scst``, or for the Transformer decoder
``flickr8k_full_transformer`` and ``flickr8k_full_transformer_scst``. Per run: what it changed,
validation CIDEr per epoch (the subset decoded during training), for SCST the mean reward and the share of samples
cut at the length limit in its last epoch, and its best checkpoint (or the checkpoint named, such as the
cross-entropy start an SCST run kept) on every validation photo decoded twice, so that an SCST model and its start
are compared under the same rules: on the subset with the cross-entropy recipe's ``decode`` section (beam 3,
``max_length`` 22, ``block_ngram`` 2, ``no_dangling_end``) and with the SCST recipe's (beam 3, ``max_length`` 16);
on the full Flickr8k with the recipes' (the same for both) and greedily (beam 1, neither rule).

    python scripts/scst_diagnosis.py runs/diag/xe_ls01 runs/diag/scst_recipe ... --save scst_diagnosis
    python scripts/scst_diagnosis.py --study full runs/flickr8k_full/soft_scst_s0/cross_entropy.pt \
        runs/diag_full/scst_dropout_on ... --save scst_diagnosis_full
    python scripts/scst_diagnosis.py --study full runs/diag54/cos6_xe01/cross_entropy.pt runs/diag54/cos6_xe01 \
        --save scst_diagnosis_full --merge
    python scripts/scst_diagnosis.py --study full runs/flickr8k_full/soft_scst_lite2_s0/cross_entropy.pt \
        runs/flickr8k_full/soft_scst_lite2_s0 --train-images 1000 --save scst_diagnosis_full --merge

``--train-images N`` also decodes each checkpoint on the first N photos it was trained on (those SCST samples on)
with the first decoding: how closely it fits them, beside validation.

Never commit what the runs write (runs/): the photos are for research use only.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch
import yaml
from hard_attention_diagnosis import differences, joined_record, merged

from captioner.checkpoint import checkpoint_digest, load_checkpoint
from captioner.config import load_config, recipes
from captioner.core.process import set_up_process
from captioner.data.vocabulary import Vocabulary, with_training_counts
from captioner.decoding.search import DecodeConfig
from captioner.evaluation.diversity import unseen_endings
from captioner.results.record import machine_block, write_result
from captioner.workflows.evaluate import evaluate_checkpoint
from captioner.workflows.report import read_metrics

STUDIES = {"subset": {"lstm": ("flickr8k_soft", "flickr8k_soft_scst")},
           "full": {"lstm": ("flickr8k_full_soft", "flickr8k_full_soft_scst"),
                    "transformer": ("flickr8k_full_transformer", "flickr8k_full_transformer_scst")}}
"""Per study and decoder (``model.decoder``), its cross-entropy recipe and its SCST recipe: the quick subset (700
training photos) and the full Flickr8k. The first decoder's recipes name the study's decodings (:func:`decodings`),
which every recipe of the study shares."""
# a run's changes against its recipe that shape no number of its training step or decoding
LENGTH_AND_START = ("train.epochs=", "train.val_max_images=", "train.init_from=", "run.seed=", "train.scst_patience=",
                    "train.early_stopping=", "data.features=", "data.max_val_images=")


ADJUSTED = ", logit adjustment "
"""The name of a decoding with ``decode.logit_adjustment``: the cross-entropy recipe's, ADJUSTED, then tau."""
SEEN_ENDINGS = ", seen endings"
"""The name of a decoding with ``decode.seen_endings``: the cross-entropy recipe's, then SEEN_ENDINGS."""


def decodings(study: str, adjustments: Sequence[float] = (), seen_endings: bool = False) -> dict[str, dict]:
    """The decodings each checkpoint of ``study`` is scored with. The subset: its cross-entropy recipe's
    ``decode`` section and its SCST recipe's. The full Flickr8k, whose two recipes decode alike: theirs, and
    ``greedy`` (beam 1 without the blocking and ending rules: the policy's own mode). Then for each tau of
    ``adjustments``, the cross-entropy recipe's with ``decode.logit_adjustment`` tau; with ``seen_endings``, the
    cross-entropy recipe's with ``decode.seen_endings``."""
    xe_recipe, scst_recipe = STUDIES[study]["lstm"]
    xe, scst = (load_config(recipes()[name]).to_dict()["decode"] for name in (xe_recipe, scst_recipe))
    if study == "subset":
        found = {xe_recipe: xe, scst_recipe: scst}
    else:
        found = {xe_recipe: xe, "greedy": {**xe, "beam": 1, "block_ngram": 0, "no_dangling_end": False,
                                         "seen_endings": False}}
    found |= {f"{xe_recipe}{ADJUSTED}{tau:g}": {**xe, "logit_adjustment": tau} for tau in adjustments}
    return found | ({f"{xe_recipe}{SEEN_ENDINGS}": {**xe, "seen_endings": True}} if seen_endings else {})


def check_shared_decoding(study: str) -> None:
    """The other decoders' recipes of ``study`` decode as the first decoder's cross-entropy recipe, which names the
    study's decodings (:func:`decodings`)."""
    (named, _), *others = STUDIES[study].values()
    decode = load_config(recipes()[named]).to_dict()["decode"]
    for name in (name for pair in others for name in pair):
        if load_config(recipes()[name]).to_dict()["decode"] != decode:
            raise SystemExit(f"{name} decodes unlike {named}: its runs cannot be scored beside them")


def decoding(name: str, study: str) -> dict:
    """The ``decode`` section of the decoding ``name`` of :func:`decodings`."""
    tau = [float(name.split(ADJUSTED)[1])] if ADJUSTED in name else []
    return decodings(study, tau, name.endswith(SEEN_ENDINGS))[name]


def folder_name(mode: str) -> str:
    """The folder a decoding's scores of a checkpoint are written to, after ``val_`` (or ``val_STEM_``)."""
    return mode.replace(ADJUSTED, "_logit_adjustment_").replace(SEEN_ENDINGS, "_seen_endings")


def with_endings(checkpoint: Path, folder: Path) -> Vocabulary:
    """The vocabulary of ``checkpoint`` with its training captions' endings (for :func:`unseen_endings`), counted on
    the train split of its run's data where it was saved without them."""
    return with_training_counts(Vocabulary.from_dict(load_checkpoint(checkpoint)["vocab"]),
                                load_config(folder / "config.yaml").data)


def decode_overrides(decode: dict) -> list[str]:
    return [f"decode.{key}={json.dumps(value)}" for key, value in decode.items()]


def scored_run(path: Path, study: str, adjustments: Sequence[float] = (), seen_endings: bool = False,
               train_images: int = 0) -> dict:
    """One finished run (a folder: its ``best.pt``; or one checkpoint of a run, such as an SCST run's
    ``cross_entropy.pt``): its changes against its recipe, its validation curve (up to the checkpoint's epoch) and
    SCST statistics, and the checkpoint on all validation photos with each of :func:`decodings` (``adjustments``:
    its logit adjustments; ``seen_endings``: also with ``decode.seen_endings``), with the share of captions that stop
    where no training caption does; with ``train_images``, also on the first that many photos it was trained on
    (at most its run's ``data.max_train_images``) with the first decoding: how closely it fits them."""
    folder, checkpoint = (path.parent, path) if path.suffix == ".pt" else (path, path / "best.pt")
    config = yaml.safe_load((folder / "config.yaml").read_text())
    decoder = config["model"]["decoder"]
    if decoder not in STUDIES[study]:
        raise SystemExit(f"{folder}: its {decoder} decoder has no recipes in --study {study}")
    xe, scst = STUDIES[study][decoder]
    recipe = scst if config["train"]["objective"] == "scst" else xe
    records = read_metrics(folder)
    last_epoch = (torch.load(checkpoint, map_location="cpu", weights_only=True)["progress"]["epoch"]
                  if checkpoint.name != "best.pt" else math.inf)
    curve = [r for r in records if r["type"] == "val" and r["epoch"] <= last_epoch]
    sampled = [r for r in records
               if r["type"] == "train" and r["objective"] == "scst" and r["epoch"] == curve[-1]["epoch"]]
    name = folder.name if checkpoint.name == "best.pt" else f"{folder.name}/{checkpoint.name}"
    row = {"run": name, "recipe": recipe, "init_from": config["train"].get("init_from"),
           "changes": differences(config, load_config(recipes()[recipe]).to_dict()),
           "val_curve": [{"epoch": r["epoch"], "CIDEr": round(r["CIDEr"], 4)} for r in curve],
           "best_epoch": max(curve, key=lambda r: r["CIDEr"])["epoch"], "decoded": {}}
    if sampled:
        row["last_epoch_samples"] = {key: round(sum(r[key] for r in sampled) / len(sampled), 4)
                                     for key in ("reward", "cut_share", "caption_length", "sample_entropy")}
    vocab = with_endings(checkpoint, folder)
    for mode, decode in decodings(study, adjustments, seen_endings).items():
        scored = kept_beside(folder, checkpoint, "val", folder_name(mode))
        scores = scored_once(checkpoint, "val", scored, "data.max_val_images=null", decode)
        diversity = scores["diversity"]
        captions = {c["image_id"]: c["caption"] for c in json.loads((scored / "captions_val.json").read_text())}
        row["decoded"][mode] = {
            "images": scores["images"], **{k: round(scores[k], 4) for k in ("BLEU-4", "METEOR", "CIDEr")},
            "distinct_captions": round(diversity["distinct_captions"], 4),
            "vocabulary_used": diversity["vocabulary_used"], "mean_length": round(diversity["mean_length"], 2),
            "dangling_end": round(diversity["dangling_end"], 4),
            "unseen_end": round(unseen_endings(captions, vocab), 4),
            "repeated_bigram": round(diversity["repeated_bigram"], 4)}
        print(json.dumps({"run": row["run"], "decoding": mode, **row["decoded"][mode]}), flush=True)
    if train_images:
        trained_on = config["data"].get("max_train_images")         # the quick subset's runs train on 700
        photos = min(train_images, trained_on) if trained_on else train_images
        mode, decode = next(iter(decodings(study).items()))
        row["train_fit"] = {"decoding": mode, **train_fit(checkpoint, folder, photos, decode)}
        print(json.dumps({"run": row["run"], "train_fit": row["train_fit"]}), flush=True)
    return row


def train_fit(checkpoint: Path, folder: Path, images: int, decode: dict) -> dict:
    """``checkpoint`` on the first ``images`` training photos of its run's data with ``decode``: BLEU-4 and CIDEr
    (scored against those photos' own references), kept beside the run as the validation scores are."""
    scores = scored_once(checkpoint, "train", kept_beside(folder, checkpoint, "train", str(images)),
                         f"data.max_train_images={images}", decode)
    return {"images": scores["images"], **{k: round(scores[k], 4) for k in ("BLEU-4", "CIDEr")}}


def kept_beside(folder: Path, checkpoint: Path, split: str, name: str) -> Path:
    """Where ``checkpoint``'s scores on ``split`` are kept in its run ``folder``: ``SPLIT_NAME`` for ``best.pt``,
    ``SPLIT_STEM_NAME`` for another checkpoint of the run (such as ``cross_entropy.pt``)."""
    parts = [split, name] if checkpoint.name == "best.pt" else [split, checkpoint.stem, name]
    return folder / "_".join(parts)


def scored_once(checkpoint: Path, split: str, folder: Path, photos: str, decode: dict) -> dict:
    """The scores of ``checkpoint`` on ``split`` (its photos chosen by the override ``photos``) with ``decode``,
    written to ``folder``: those kept there where they were made from this very checkpoint, on these photos, with
    this decoding, else decoded now."""
    scored = folder / f"scores_{split}.json"
    scores = json.loads(scored.read_text()) if scored.exists() else None
    if (scores and [o for o in scores.get("overrides", []) if not o.startswith("decode.")] == [photos]
            and DecodeConfig(**decode).same_as(scores["decode"])
            and scores.get("checkpoint_sha256") == [checkpoint_digest(checkpoint)]):
        return scores
    return evaluate_checkpoint(checkpoint, split, out_dir=folder, progress=False,
                               overrides=[photos, *decode_overrides(decode)])


def made_by(rows: list[dict], study: str) -> tuple[list[str], list[str]]:
    """The configs and probes of the result: each row's recipe with the changes that shape its training (trained as
    it was), and the decoding probes of :func:`decodings` (a train fit decodes with the first of them)."""
    configs = []
    for row in rows:
        changes = [c for c in row["changes"] if not c.startswith((*LENGTH_AND_START, "decode."))]
        configs.append(" ".join([row["recipe"], *changes]))
    configs = list(dict.fromkeys(configs))
    names = dict.fromkeys(name for row in rows for name in row["decoded"])
    probes = ["text", "metrics", *(f"train {config}" for config in configs),
              *(" ".join(["decode", STUDIES[study]["lstm"][0], *decode_overrides(decoding(name, study))])
                for name in names)]
    return configs, probes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run folders (best.pt, config.yaml, metrics.jsonl), or checkpoints "
                        "of run folders (an SCST run's cross_entropy.pt)")
    parser.add_argument("--study", choices=tuple(STUDIES), default="subset",
                        help="which recipes the runs were trained by: the quick subset's or the full Flickr8k's")
    parser.add_argument("--save", metavar="NAME", help="also write benchmarks/results/NAME.json")
    parser.add_argument("--logit-adjustment", type=float, nargs="+", default=[], metavar="TAU",
                        help="also decode with the cross-entropy recipe's decoding and decode.logit_adjustment TAU")
    parser.add_argument("--seen-endings", action="store_true",
                        help="also decode with the cross-entropy recipe's decoding and decode.seen_endings")
    parser.add_argument("--train-images", type=int, default=0, metavar="N",
                        help="also decode each checkpoint on the first N photos it was trained on (at most its run's "
                        "data.max_train_images), with the first decoding: how closely it fits them")
    parser.add_argument("--merge", action="store_true", help="keep the saved result's other runs (each with the "
                        "machine it was measured on), where they are current; a run of the same name is replaced "
                        "(give --train-images again to keep its train CIDEr)")
    args = parser.parse_args()
    if args.train_images < 0:
        parser.error(f"--train-images must be 0 (none) or more, not {args.train_images}")
    check_shared_decoding(args.study)
    record = joined_record(args.save, args.merge, lambda row: [name for names in made_by([row], args.study)
                                                               for name in names])
    studied = {name for pair in STUDIES[args.study].values() for name in pair}
    if record is not None and (others := {r["recipe"] for r in record["result"]["runs"]} - studied):
        raise SystemExit(f"{args.save}: its runs were trained by {', '.join(sorted(others))}, not by --study "
                         f"{args.study}'s recipes; new runs cannot join them")
    rows = [{**scored_run(Path(run), args.study, args.logit_adjustment, args.seen_endings, args.train_images),
             "machine": machine_block()} for run in args.runs]
    if record is not None:
        rows = merged(record, rows)
    if args.save:
        configs, probes = made_by(rows, args.study)
        write_result(args.save, {"runs": rows}, configs=configs, probes=probes)


if __name__ == "__main__":
    set_up_process()    # as every captioner command: its times are those of captioner train
    main()
