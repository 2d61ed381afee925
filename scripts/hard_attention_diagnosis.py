"""Why does hard attention fail on real photos? Two measurements on a trained checkpoint (any LSTM decoder with an
attention score; a soft one is read as hard):

* ``snr``: the REINFORCE gradient of the attention network on one fixed batch of training captions, drawn many
  times, under each reward and baseline: its signal-to-noise ratio (the norm of the expected gradient over the
  root mean square deviation of one draw from it, both estimated from the draws without bias: above 1, one
  step's estimate points where the expected gradient does), the cosine of the draws' mean with the likelihood gradient of the expectation path (``z = sum alpha a``, which needs no
  estimator), and its size against that gradient. The rewards: ``sequence`` (the caption's log-likelihood, the
  paper), ``per_word`` (divided by its length); the baselines: ``moving`` (the batch's mean reward, what the
  moving average settles at), ``caption`` (leave-one-out: the mean reward of the caption's other location
  samples, ``loss.hard_baseline=caption`` with ``model.lstm.location_samples`` > 1; beside it the moving baseline
  with as many samples, which costs the same).
* ``decode``: the validation captions decoded with each ``model.lstm.hard_decode`` (argmax, sample, expectation):
  CIDEr, distinct captions, attention entropy.
* ``runs``: finished training runs side by side (hard variants and their soft control, trained by ``captioner
  train`` with the overrides each run's ``config.yaml`` records against its recipe): validation scores per epoch
  (the subset decoded during training), then the best checkpoint on all validation photos with each decoding,
  and its pointing on coco-mini (``$CAPTIONER_COCO_MINI``, default ``data/coco-mini``: COCO photos with instance
  masks, see ``scripts/coco_mini.py``).

``snr`` and ``runs`` write their result to ``benchmarks/results/`` (``--save NAME``), whose tables the docs show;
``decode`` prints one JSON object per line.

    python scripts/hard_attention_diagnosis.py snr runs/diag/word_moving/best.pt --draws 48 --save hard_attention_snr
    python scripts/hard_attention_diagnosis.py decode runs/flickr8k_full/hard_s0/best.pt --split val
    python scripts/hard_attention_diagnosis.py runs runs/diag/soft runs/diag/seq_moving ... --save hard_attention_runs
    python scripts/hard_attention_diagnosis.py runs runs/diag55/marginal_k4 --save hard_attention_runs --merge
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from coco_mini import coco_mini_features, coco_mini_overrides

from captioner.checkpoint import load_model
from captioner.config import load_config, recipes
from captioner.core.process import set_up_process
from captioner.core.randomness import seed_everything
from captioner.data.dataset import collate, make_dataset
from captioner.data.readers import read_split
from captioner.data.tokens import PAD_INDEX
from captioner.objectives.losses import caption_baseline, caption_log_likelihood, location_reward, reinforce_term
from captioner.results.record import RESULTS_DIR, machine_block, stale_parts, write_result
from captioner.workflows.evaluate import evaluate_checkpoint
from captioner.workflows.report import read_metrics

ROOT = Path(__file__).resolve().parent.parent
REWARDS = ("sequence", "per_word")
HARD, SOFT = "flickr8k_full_hard", "flickr8k_full_soft"
# a run's changes against its recipe that shape no number of its training step or decoding
LENGTH_AND_START = ("train.epochs=", "train.val_max_images=", "train.init_from=", "run.seed=")


def trained(*configs: str) -> list[str]:
    """The probes of the code that trains and decodes with each of ``configs``."""
    return [f"{probe} {config}" for config in configs for probe in ("train", "decode")]


def runs_made_by(rows: list[dict]) -> tuple[list[str], list[str]]:
    """The configs and probes of a ``runs`` result: the soft control where a row is one, each hard variant from
    the changes its row records, decoded as the rows are (argmax and expectation), and each variant of the soft
    recipe (marginal, variational) with its own decoding."""
    soft = any(row["recipe"] == SOFT for row in rows)
    configs, probes = [SOFT, HARD] if soft else [HARD], ["text", "metrics", *(trained(SOFT) if soft else [])]
    for row in rows:
        changes = [c for c in row["changes"] if not c.startswith(LENGTH_AND_START)]
        if changes:
            configs.append(" ".join([row["recipe"], *changes]))
            probes.append(f"train {configs[-1]}")
            if row["recipe"] == SOFT:       # marginal and variational attention decode by their own rules
                probes.append(f"decode {configs[-1]}")
    probes += [f"decode {HARD} model.lstm.hard_decode={decoding}" for decoding in ("argmax", "expectation")]
    return list(dict.fromkeys(configs)), list(dict.fromkeys(probes))


def snr_made_by(checkpoint_changes: list[str]) -> tuple[list[str], list[str]]:
    """The config and probes of an ``snr`` result: the checkpoint's variant of the hard recipe with every row
    sampled, under each reward, baseline and sample count the measurement covers."""
    base = " ".join([HARD, *checkpoint_changes, "model.lstm.expectation_probability=0"])
    variants = ["loss.hard_reward=sequence",
                "loss.hard_reward=per_word model.lstm.location_samples=2 loss.hard_baseline=caption",
                "loss.hard_reward=sequence model.lstm.location_samples=4 loss.hard_baseline=caption"]
    return [base], [f"train {base} {variant}" for variant in variants]


def training_batch(config, vocab, model, size: int, seed: int) -> dict:
    """``size`` (image, caption) pairs of the training split, drawn with ``seed``, collated as training sees them."""
    dataset = make_dataset(config.data, read_split(config.data, "train"), vocab, model.encoder, pairs=True)
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randperm(len(dataset), generator=generator)[:size].tolist()
    return collate([dataset[i] for i in picks])


def attention_parameters(decoder) -> list[torch.nn.Parameter]:
    """The weights that shape alpha and nothing else: the attention module's (score, projections)."""
    return [p for p in decoder.attention.parameters() if p.requires_grad]


def flat_gradient(loss: torch.Tensor, parameters) -> torch.Tensor:
    grads = torch.autograd.grad(loss, parameters, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, parameters)])


def draw(decoder, regions, captions, repeats: int):
    """One teacher-forced pass with every row sampled (no expectation rows), ``repeats`` location samples per
    caption: ``(log p(y|s,a)`` per caption (B*repeats,), ``sum_t log alpha_t[s_t]`` (B*repeats,), words per caption)."""
    decoder.config.location_samples = repeats
    out = decoder(regions, captions)
    log_likelihood, mask = caption_log_likelihood(out.logits, captions[:, 1:].repeat_interleave(repeats, 0))
    return log_likelihood.detach(), (out.log_prob_location.float() * mask).sum(1), mask.sum(1)


def reinforce_surrogate(log_likelihood, location_log_prob, lengths, reward: str, baseline: str, repeats: int):
    """HardAttentionLoss's REINFORCE term for rows that all sampled their locations, ``repeats`` rows per caption,
    under the reward ``reward`` and the baseline ``baseline`` (``moving``: the batch's mean reward, where the moving
    average settles)."""
    r = location_reward(log_likelihood, lengths, reward)
    b = caption_baseline(r, torch.full((len(r) // repeats,), repeats)) if baseline == "caption" else r.mean()
    return reinforce_term(r - b, location_log_prob, lengths.sum())


def snr(args) -> None:
    model, vocab, config, _ = load_model(args.checkpoint, overrides=["model.lstm.attention_mode=hard",
                                                                     "model.lstm.expectation_probability=0"])
    decoder = model.decoder
    seed_everything(args.seed)
    batch = training_batch(config, vocab, model, args.batch, args.seed)
    regions, captions = batch["features"].float(), batch["captions"]
    parameters = attention_parameters(decoder)
    decoder.train()
    for module in decoder.modules():             # dropout off: the only randomness left is the location samples
        if isinstance(module, torch.nn.Dropout):
            module.eval()
    # the likelihood gradient of the expectation path: every row soft, no estimator needed
    decoder.config.expectation_probability, decoder.config.location_samples = 1.0, 1
    out = decoder(regions, captions)
    targets = captions[:, 1:]
    soft = flat_gradient(torch.nn.functional.cross_entropy(out.logits.float(), targets[targets != PAD_INDEX]), parameters)
    decoder.config.expectation_probability = 0.0
    rows = []
    for reward in REWARDS:
        # the moving baseline with as many samples as the caption baseline: the same cost, so what the caption
        # baseline adds beyond averaging more draws
        for baseline, repeats in [("moving", 1)] + [(b, k) for k in args.samples for b in ("moving", "caption")]:
            grads = []
            for _ in range(args.draws):
                log_likelihood, location_log_prob, lengths = draw(decoder, regions, captions, repeats)
                grads.append(flat_gradient(reinforce_surrogate(log_likelihood, location_log_prob, lengths, reward,
                                                               baseline, repeats), parameters))
            grads = torch.stack(grads)
            mean = grads.mean(0)
            variance = (grads - mean).pow(2).sum(1).sum() / (args.draws - 1)     # trace of one draw's covariance
            # E |mean|^2 = |expected gradient|^2 + variance / draws: the signal without the draws' own noise
            signal = (mean.pow(2).sum() - variance / args.draws).clamp_min(0).sqrt()
            rows.append({"reward": reward, "baseline": baseline, "location_samples": repeats,
                         "snr": round((signal / variance.sqrt()).item(), 4),
                         "cosine_with_expectation_gradient": round(torch.cosine_similarity(mean, soft, 0).item(), 4),
                         "size_against_expectation_gradient": round((grads.norm(dim=1).mean() / soft.norm()).item(), 3)})
            print(json.dumps(rows[-1]), flush=True)
    if args.save:
        changes = [c for c in differences(config.to_dict(), load_config(recipes()[HARD]).to_dict())
                   if not c.startswith(LENGTH_AND_START) and not c.startswith(("model.lstm.attention_mode=",
                                                                               "model.lstm.expectation_probability="))]
        configs, probes = snr_made_by(changes)
        write_result(args.save, {"checkpoint": args.checkpoint, "draws": args.draws, "batch": args.batch,
                                 "settings": rows}, configs=configs, probes=probes)


def decode(args) -> None:
    for mode in ("argmax", "sample", "expectation"):
        scores = evaluate_checkpoint(args.checkpoint, args.split, out_dir=f"{args.out}/{mode}", progress=False,
                                     overrides=[f"model.lstm.hard_decode={mode}", *args.overrides])
        attention = scores.get("attention") or {}
        print(json.dumps({"checkpoint": args.checkpoint, "hard_decode": mode, "images": scores["images"],
                          **{k: round(scores[k], 4) for k in ("BLEU-1", "BLEU-4", "METEOR", "CIDEr")},
                          "diversity": scores["diversity"], "mean_entropy": attention.get("mean_entropy"),
                          "peak_ratio": attention.get("peak_ratio")}), flush=True)


def differences(run: dict, recipe: dict, prefix: str = "") -> list[str]:
    """The settings of a run's config (nested dicts) that differ from its recipe's, as ``section.key=value``."""
    out = []
    for key, value in run.items():
        if isinstance(value, dict):
            out += differences(value, recipe.get(key) or {}, f"{prefix}{key}.")
        elif value != recipe.get(key) and f"{prefix}{key}" != "run.out":
            out.append(f"{prefix}{key}={value}")
    return out


def scored_run(folder: Path) -> dict:
    """One finished run: what it changed against its recipe, its validation curve, and its best checkpoint on all
    validation photos and on coco-mini with each decoding that applies."""
    config = yaml.safe_load((folder / "config.yaml").read_text())
    mode = config["model"]["lstm"]["attention_mode"]
    hard = mode == "hard"
    recipe = HARD if hard else SOFT
    curve = [r for r in read_metrics(folder) if r.get("type") == "val"]
    row = {"run": folder.name, "recipe": recipe, "init_from": config["train"].get("init_from"),
           "changes": differences(config, load_config(recipes()[recipe]).to_dict()),
           "val_curve": [{"epoch": r["epoch"], "CIDEr": round(r["CIDEr"], 4)} for r in curve], "decoded": {}}
    for decoding in ("argmax", "expectation") if hard else (mode,):
        overrides = [f"model.lstm.hard_decode={decoding}"] if hard else []
        val = evaluate_checkpoint(folder / "best.pt", "val", out_dir=folder / f"val_{decoding}", progress=False,
                                  overrides=overrides)
        coco_mini = coco_mini_overrides(coco_mini_features(config["data"]["features"]))
        coco = evaluate_checkpoint(folder / "best.pt", "test", out_dir=folder / f"coco_mini_{decoding}",
                                   progress=False, overrides=[*overrides, *coco_mini])
        grounding = coco.get("grounding") or {}
        row["decoded"][decoding] = {
            "images": val["images"], **{k: round(val[k], 4) for k in ("BLEU-4", "METEOR", "CIDEr")},
            "distinct_captions": round(val["diversity"]["distinct_captions"], 4),
            "vocabulary_used": val["diversity"]["vocabulary_used"],
            "mean_entropy": round(val["attention"]["mean_entropy"], 3),
            **{k: round(grounding[k], 4) for k in ("pointing_accuracy", "uniform_pointing", "centre_pointing")},
            "grounded_words": grounding["words"]}
        print(json.dumps({"run": folder.name, "decoding": decoding, **row["decoded"][decoding]}), flush=True)
    return row


def merged(record: dict, rows: list[dict]) -> list[dict]:
    """The runs of a saved ``runs`` result (each with its machine block: its own, else the record's) followed by
    ``rows``, which replace saved runs of the same name."""
    named = {row["run"] for row in rows}
    return [{"machine": record["machine"], **row} for row in record["result"]["runs"] if row["run"] not in named] + rows


def joined_record(name: str | None, merge: bool, row_makers: Callable[[dict], list[str]] | None = None
                  ) -> dict | None:
    """The saved ``runs`` result ``benchmarks/results/NAME.json`` that new rows join (``--merge``), if any; so does
    ``merge`` without a ``name``. A stale one ends the script, before the scoring, which takes minutes per run;
    unless ``row_makers`` names the configs and probes that made each row: then the rows made by what changed are
    left out (each named on stderr), and the others join."""
    if merge and not name:
        raise SystemExit("--merge joins the result named by --save: give --save NAME")
    if not (merge and (saved := RESULTS_DIR / f"{name}.json").exists()):
        return None
    record = json.loads(saved.read_text())
    stale = stale_parts(record)
    rows = record["result"]["runs"]
    dropped = [row for row in rows if row_makers and stale.keys() & set(row_makers(row))]
    if unexplained := [reason for part, reasons in stale.items() for reason in reasons
                       if not any(part in row_makers(row) for row in dropped)]:
        raise SystemExit(f"{saved}: its runs were made otherwise, new ones cannot join them: {'; '.join(unexplained)}")
    for row in dropped:
        why = "; ".join(reason for part in row_makers(row) for reason in stale.get(part, []))
        print(f"{saved}: {row['run']} left out, made otherwise ({why})", file=sys.stderr)
    return {**record, "result": {**record["result"], "runs": [row for row in rows if row not in dropped]}}


def runs(args) -> None:
    record = joined_record(args.save, args.merge)
    rows = [{**scored_run(Path(folder)), "machine": machine_block()} for folder in args.folders]
    if record is not None:
        rows = merged(record, rows)
    if args.save:
        configs, probes = runs_made_by(rows)
        write_result(args.save, {"runs": rows}, configs=configs, probes=probes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("snr", help="the REINFORCE gradient's signal-to-noise ratio per reward and baseline")
    measure.add_argument("checkpoint")
    measure.add_argument("--draws", type=int, default=48, help="gradient estimates drawn per setting")
    measure.add_argument("--batch", type=int, default=64, help="captions in the fixed batch")
    measure.add_argument("--samples", type=int, nargs="+", default=[2, 4],
                         help="location samples per caption for the caption baseline (and the moving one beside it)")
    measure.add_argument("--seed", type=int, default=0)
    measure.add_argument("--save", metavar="NAME", help="also write benchmarks/results/NAME.json")
    decoding = commands.add_parser("decode", help="validation scores with each hard_decode")
    decoding.add_argument("checkpoint")
    decoding.add_argument("--split", default="val")
    decoding.add_argument("--out", default="runs/hard_decode")
    decoding.add_argument("overrides", nargs="*", help="section.key=value overrides of the checkpoint's config")
    scored = commands.add_parser("runs", help="finished runs side by side, scored on val and coco-mini")
    scored.add_argument("folders", nargs="+", help="run folders (best.pt, config.yaml, metrics.jsonl)")
    scored.add_argument("--save", metavar="NAME", help="also write benchmarks/results/NAME.json")
    scored.add_argument("--merge", action="store_true", help="keep the saved result's other runs (each with the "
                        "machine it was measured on), where they are current; a run of the same name is replaced")
    args = parser.parse_args()
    {"snr": snr, "decode": decode, "runs": runs}[args.command](args)


if __name__ == "__main__":
    set_up_process()    # as every captioner command: its times are those of captioner train
    main()
