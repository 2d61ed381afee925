"""The tables the docs show, one function per result (``benchmarks/results/NAME.json``): each takes the result's
``result`` block and returns the Markdown table's lines. :mod:`captioner.results.render` writes them between a page's
``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` with a footnote naming the command and the machine.

A new study plugs in with a function here, registered in :data:`TABLES` under its result's name, and the two
markers where its table belongs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from captioner.evaluation.caption_metrics import METRICS


def row(*cells) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def header(*names: str) -> list[str]:
    return [row(*names), row(*("---" for _ in names))]


def number(value, digits: int = 3) -> str:
    """``value`` to ``digits`` decimals, or a dash where it was not measured."""
    return "–" if value is None else f"{value:.{digits}f}"


def demo(result: dict) -> list[str]:
    """The demo's runs on the shapes test split, by name: scores, shapes measures, epochs and time; then the whole
    demo's time (data, features, training, scoring, report)."""
    lines = header("run", "BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr", "object precision", "relation accuracy",
                   "pointing accuracy", "epochs", "train s", "done after s")
    for name, scores in result["runs"].items():
        lines.append(row(f"`{name}`", *(number(scores[key]) for key in ("BLEU-1", "BLEU-4", "METEOR",
                                                                                     "ROUGE-L")),
                         number(scores["CIDEr"], 2), *(number(scores[key]) for key in (
                             "object_precision", "relation_accuracy", "pointing_accuracy")),
                         scores["epochs"], f"{scores['train_seconds']:.0f}", f"{scores['done_after_seconds']:.0f}"))
    lines.append(row("whole demo", *([""] * 10),
                     f"{result['total_seconds']:.0f}"))
    return lines


def scaling(result: dict) -> list[str]:
    """Step time of the soft LSTM as caption length T, regions L or batch B grows, with the fitted exponent."""
    axes = {"T": "T (words)", "L": "L (regions)", "B": "B (captions)"}
    lines = header("grows", "values", "step time (s)", "exponent k")
    for axis, label in axes.items():
        rows = result["growth"][axis]["rows"]
        lines.append(row(label, ", ".join(str(r[axis]) for r in rows), ", ".join(f"{r['step_s']:.2f}" for r in rows),
                         f"{result['growth'][axis]['exponent']:.2f}"))
    return lines


def scst(result: dict) -> list[str]:
    """Where a self-critical training step's time goes, with each baseline."""
    parts = {"sample": "sampling", "reward": "CIDEr-D reward", "greedy": "greedy captions",
             "backward_and_adam": "backward and Adam"}
    lines = header("baseline", "images/s", "step s", *parts.values())
    for name, label in (("mean_baseline", "mean of the other samples"), ("greedy_baseline", "greedy caption")):
        measured = result[name]
        lines.append(row(label, f"{measured['images_per_s']:.1f}", f"{measured['step_s']:.2f}",
                         *(f"{100 * measured['share'][part]:.1f} %" for part in parts)))
    return lines


def decode_beside_python(result: dict) -> list[str]:
    """A batch's decoding alone, beside a busy Python thread of the same process, beside a busy process."""
    settings = {"alone": "alone", "beside_a_python_thread": "beside a busy Python thread of the same process",
                "beside_a_python_process": "beside a busy process"}
    alone = result["ms_per_image"]["alone"]
    lines = header("decoding", "ms per image (median of the rounds)", "slower than alone")
    for key, label in settings.items():
        value = result["ms_per_image"][key]
        lines.append(row(label, f"{value:,.1f}", f"{value / alone:,.2f}x"))
    return lines


# Xu et al. (2015), Table 1, Flickr8k (their test split; METEOR as a fraction, as pycocoevalcap reports it)
PAPER_FLICKR8K = {"soft": {"BLEU-1": 0.67, "BLEU-2": 0.448, "BLEU-3": 0.299, "BLEU-4": 0.195, "METEOR": 0.1893},
                  "hard": {"BLEU-1": 0.67, "BLEU-2": 0.457, "BLEU-3": 0.314, "BLEU-4": 0.213, "METEOR": 0.2030}}


def mean_spread(values: list[float], digits: int = 3) -> str:
    """The mean of ``values``, with half their range (± the seeds' spread) where there are several."""
    if not values:
        return "–"
    mean = sum(values) / len(values)
    return f"{mean:.{digits}f}" + (f" ± {(max(values) - min(values)) / 2:.{digits}f}" if len(values) > 1 else "")


def flickr8k_full(result: dict) -> list[str]:
    """The Flickr8k study (``scripts/flickr8k_study.py``): one line per recipe and ablation, the mean over its seeds
    with their spread, on the 1,000 validation photos (an SCST recipe's cross-entropy start on the line above it);
    each SCST run's CIDEr gain and share of words kept against its cross-entropy start (a fine-tuning run's: that of
    the SCST run it fine-tunes, its ``after``), naming how many seeds it covers where some have no start; coco-mini
    pointing beside the uniform map's and the centre's; then the paper's Table 1 rows (on the official test split)."""
    groups: dict[tuple[str, bool], list[dict]] = {}
    for run in result["runs"].values():
        groups.setdefault((run["recipe"], run["ablation"]), []).append(run)

    def values(runs: list[dict], *path: str) -> list[float]:
        found = []
        for run in runs:
            for key in path:
                run = (run or {}).get(key)
            if run is not None:
                found.append(run)
        return found

    def against_start(run: dict) -> tuple[float, float] | None:
        """``run``'s CIDEr gain and words used, in % of its cross-entropy start's; None for a run with none."""
        start = (result["runs"].get(run["after"]) or {}).get("start") if run.get("after") else run.get("start")
        if not start or not start["val"]["CIDEr"]:
            return None
        return (100 * (run["val"]["CIDEr"] / start["val"]["CIDEr"] - 1),
                100 * run["diversity"]["vocabulary_used"] / start["diversity"]["vocabulary_used"])

    lines = header("run", "seeds", *METRICS, "words used", "distinct", "repeated bigram",
                   "CIDEr gain, words kept (against its cross-entropy start)", "entropy",
                   "peak / uniform", "coco-mini pointing (uniform, centre)", "coco-mini mass in mask (uniform)",
                   "train CPU min")
    for (recipe, ablation), runs in sorted(groups.items()):
        starts = values(runs, "start")
        if starts:
            lines.append(row(f"`{recipe}`: its cross-entropy start", len(starts),
                             *(mean_spread(values(starts, "val", m)) for m in METRICS),
                             mean_spread(values(starts, "diversity", "vocabulary_used"), 0),
                             mean_spread(values(starts, "diversity", "distinct_captions"), 2),
                             mean_spread(values(starts, "diversity", "repeated_bigram"), 2), *(["–"] * 6)))
        pointing = values(runs, "coco_mini", "pointing_accuracy")
        gains = [pair for run in runs if (pair := against_start(run))]
        lines.append(row(f"`{recipe}`" + (" without attention" if ablation else ""), len(runs),
                         *(mean_spread(values(runs, "val", m)) for m in METRICS),
                         mean_spread(values(runs, "diversity", "vocabulary_used"), 0),
                         mean_spread(values(runs, "diversity", "distinct_captions"), 2),
                         mean_spread(values(runs, "diversity", "repeated_bigram"), 2),
                         f"{mean_spread([g for g, _ in gains], 1)} %, {mean_spread([w for _, w in gains], 0)} %"
                         + (f" ({len(gains)} of {len(runs)} seeds)" if len(gains) < len(runs) else "")
                         if gains else "–",
                         mean_spread(values(runs, "attention", "mean_entropy"), 2),
                         mean_spread(values(runs, "attention", "peak_ratio"), 1),
                         f"{mean_spread(pointing)} ({mean_spread(values(runs, 'coco_mini', 'uniform_pointing'))}, "
                         f"{mean_spread(values(runs, 'coco_mini', 'centre_pointing'))})" if pointing else "–",
                         f"{mean_spread(values(runs, 'coco_mini', 'attention_inside'))} "
                         f"({mean_spread(values(runs, 'coco_mini', 'uniform_inside'))})" if pointing else "–",
                         mean_spread([s / 60 for s in values(runs, "train_cpu_seconds")], 0)))
    for name, scores in PAPER_FLICKR8K.items():
        lines.append(row(f"Xu et al. 2015, {name} (test split)", "–",
                         *(number(scores.get(m)) for m in METRICS), *(["–"] * 9)))
    return lines


def flickr8k_trials(result: dict) -> list[str]:
    """Trials of the Flickr8k study's recipes (``scripts/flickr8k_study.py KIND --save flickr8k_trials``): what each
    changed, the validation subset's CIDEr per epoch (its best in bold), the training wall time, and the best
    checkpoint on all 1,000 validation photos."""
    lines = header("trial", "recipe", "changes", "val CIDEr by epoch (subset)", "train min", *METRICS[3:],
                   "words used", "distinct")
    for name, run in sorted(result["runs"].items()):
        curve = [point["CIDEr"] for point in run["val_curve"]]
        best = curve.index(max(curve)) if curve else -1
        lines.append(row(f"`{name}`", f"`{run['recipe']}`",
                         ", ".join(f"`{o}`" for o in run["overrides"] if not o.startswith("run.")) or "–",
                         ", ".join(f"**{number(c)}**" if i == best else number(c) for i, c in enumerate(curve)),
                         number(run["train_seconds"] / 60, 1),
                         *(number(run["val"][m]) for m in METRICS[3:]),
                         run["diversity"]["vocabulary_used"], number(run["diversity"]["distinct_captions"], 2)))
    return lines


def hard_attention_snr(result: dict) -> list[str]:
    """The REINFORCE gradient of the attention network on one batch, per reward and baseline
    (``scripts/hard_attention_diagnosis.py snr``)."""
    lines = header("reward", "baseline", "location samples", "signal / noise", "cosine with the expectation's gradient",
                   "size / the expectation's gradient")
    for setting in result["settings"]:
        lines.append(row(setting["reward"], setting["baseline"], setting["location_samples"],
                         number(setting["snr"], 2), number(setting["cosine_with_expectation_gradient"], 2),
                         number(setting["size_against_expectation_gradient"], 1)))
    return lines


def measured_on(run: dict, result: dict) -> str:
    """`` (YYYY-MM-DD)``, the day ``run`` was measured on, where the runs of ``result`` were measured on more than
    one day (rows that joined it later, ``--merge``); else nothing."""
    days = {r["machine"]["date"][:10] for r in result["runs"] if "machine" in r}
    return f" ({run['machine']['date'][:10]})" if len(days) > 1 and "machine" in run else ""


def hard_attention_runs(result: dict) -> list[str]:
    """Hard-attention variants and their soft control at one budget (``scripts/hard_attention_diagnosis.py
    runs``): what each changed, validation CIDEr per epoch, and the best checkpoint on all validation photos and on
    coco-mini with each decoding (a row each; the run's own cells on its first), with the day of each run where
    they were measured on several (:func:`measured_on`)."""
    lines = header("run", "differs from the shipped recipe", "val CIDEr by epoch (subset)", "decoding", "BLEU-4",
                   "METEOR", "CIDEr", "distinct", "words used", "entropy", "coco-mini pointing (uniform, centre)")
    for run in result["runs"]:
        changes = ", ".join(f"`{c}`" for c in run["changes"] if not c.startswith(("train.epochs", "train.val_max_images")))
        measured = measured_on(run, result)
        for first, (mode, scored) in zip((True, False, False), run["decoded"].items()):
            named = (f"`{run['run']}`{measured}", changes or "–",
                     ", ".join(number(point["CIDEr"]) for point in run["val_curve"]))
            lines.append(row(*(named if first else ("", "", "")), mode,
                             number(scored["BLEU-4"]), number(scored["METEOR"]), number(scored["CIDEr"]),
                             number(scored["distinct_captions"], 2), scored["vocabulary_used"],
                             number(scored["mean_entropy"], 2),
                             f"{number(scored['pointing_accuracy'])} ({number(scored['uniform_pointing'])}, "
                             f"{number(scored['centre_pointing'])})"))
    return lines


def marginal_attention(result: dict) -> list[str]:
    """Marginal attention's cost beside soft attention's (``benchmarks/bench_marginal.py``): per variant, training
    words/s and beam-search images/s, each with its ratio to soft (median over the rounds, their min-max)."""
    lines = header("variant", "training words/s", "ratio to soft (min-max)", "decoding images/s",
                   "ratio to soft (min-max)")
    for name, variant in result["variants"].items():
        cells = []
        for part, unit in (("training", "words_per_s"), ("decoding", "images_per_s")):
            measured = variant[part]
            low, high = measured["ratio_min_max"]
            cells += [f"{measured[unit]:,.1f}", f"{measured['ratio_to_soft']:.3f} ({low:.3f}-{high:.3f})"]
        lines.append(row(name, *cells))
    return lines


WIDEST_FIRST = ("amx_bf16", "avx512_bf16", "avx512f", "avx2", "avx")
"""Vector extensions from the widest down: a CPU is named with the first it has."""


def cpu_name(machine: dict) -> str:
    """A machine block's CPU with the widest vector extension it has: ``AMD EPYC (avx512_bf16)``, for one CPU model
    string covers machines with and without native bf16."""
    flags = machine.get("cpu_flags") or []
    return machine["cpu"] + next((f" ({flag})" for flag in WIDEST_FIRST if flag in flags), "")


def entry_key(entry: dict, machine: dict) -> str:
    """The key of a recipe's timing in a result: ``RECIPE on GPU`` or ``RECIPE on CPU (WIDEST EXTENSION)``."""
    return f"{entry['recipe']} on {entry['device'] if entry['device'] != 'cpu' else cpu_name(machine)}"


def recipe_times(result: dict) -> list[str]:
    """Each shipped Flickr8k recipe's wall time end to end (``scripts/recipe_time.py``), alone on its machine: training
    with its validations, then scoring the best checkpoint on every validation photo. A CPU is named with the widest
    vector extension it has (``avx512_bf16``: native bf16)."""
    lines = header("recipe", "device", "precision", "epochs", "train min", "score min", "total min",
                   "load before (1 min)", "val CIDEr")
    for entry in result["entries"].values():
        machine = entry["machine"]
        device = (entry["device"] if entry["device"] != "cpu" else
                  f"{cpu_name(machine)}, {machine['cores']} cores, {machine['threads']} torch threads")
        lines.append(row(f"`{entry['recipe']}`", device, entry["precision"], entry["epochs"],
                         number(entry["train_seconds"] / 60, 1), number(entry["score_seconds"] / 60, 1),
                         number((entry["train_seconds"] + entry["score_seconds"]) / 60, 1),
                         number(entry["load_before"][0], 2), number(entry["val_cider"])))
    return lines


def recipe_speed(result: dict) -> list[str]:
    """Training steps of shipped recipes' decoders, alternated in one run (``benchmarks/bench_recipes.py``): each
    recipe's regions, target words/s and its ratio to the first recipe's (median of the rounds, with their range)."""
    lines = header("recipe", "encoder", "regions × width", "epochs (at most)", "words/s", "ratio to the first")
    first = next(iter(result["recipes"]))
    for name, entry in result["recipes"].items():
        low, high = entry["ratio_min_max"]
        ratio = f"{number(entry['ratio_to_first'], 2)} ({number(low, 2)}-{number(high, 2)})" if name != first else "–"
        lines.append(row(f"`{name}`", f"{entry['encoder']} at {entry['image_size']} px",
                         f"{entry['regions']} × {entry['feature_dim']}", entry["epochs"],
                         number(entry["words_per_s"], 0), ratio))
    return lines


def process_setup(result: dict) -> list[str]:
    """Training steps in fresh processes set up as a ``captioner`` command and with Python's defaults, alternated
    (``benchmarks/bench_process_setup.py``): each workload's median step seconds and the speed-up (median of the
    rounds, with their range)."""
    steps = {"xe": "cross-entropy", "scst": "self-critical"}
    lines = header("recipe", "step", "s per step, set up", "s per step, defaults", "speed-up")
    for entry in result["workloads"]:
        low, high = entry["speed_up_min_max"]
        lines.append(row(f"`{entry['recipe']}`", steps[entry["step"]], number(entry["step_s"]["set_up"], 2),
                         number(entry["step_s"]["default"], 2),
                         f"{number(entry['speed_up'], 2)} ({number(low, 2)}-{number(high, 2)})"))
    return lines


def engine_step(result: dict) -> list[str]:
    """The training engine's step against the bare step on the same batches, alternated in one run
    (``benchmarks/bench_engine_step.py``): median milliseconds of each part, the parts the bare step lacks timed
    alone, and the bare step's time over the engine's (median of the rounds, with their range)."""
    lines = header("config", "precision", "words per step", "engine ms: loader + forward + backward and update",
                   "bare ms: forward + backward and Adam", "clipping ms", "moving average ms", "bare / engine")
    for entry in result["workloads"]:
        engine, bare, extras = entry["engine_ms"], entry["bare_ms"], entry["extras_ms"]
        low, high = entry["bare_over_engine_min_max"]
        lines.append(row(f"`{entry['config']}`", entry["precision"], number(entry["target_words_per_step"], 0),
                         f"{number(engine['total'], 0)} = {number(engine['loader'], 1)} + "
                         f"{number(engine['forward'], 0)} + {number(engine['backward_update'], 0)}",
                         f"{number(bare['total'], 0)} = {number(bare['forward'], 0)} + "
                         f"{number(bare['backward_update'], 0)}",
                         number(extras["grad_clip"], 1), number(extras["average_update"], 1),
                         f"{number(entry['bare_over_engine'], 2)} ({number(low, 2)}-{number(high, 2)})"))
    return lines


def duration(seconds: float) -> str:
    """A wall time for people: ``11 s``, ``9.0 min``, ``42 min``, ``1.8 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


ENCODER_NAMES = {"vgg19": "VGG-19", "efficientnet_lite2": "EfficientNet-Lite2"}
"""Encoders as the tables name them, by ``encoder.name``."""


def own_photos(result: dict) -> list[str]:
    """The README's "Your own photos" commands, each timed in a fresh folder (``scripts/own_photos_time.py``): the
    training as the time of one epoch and of the recipe's own epochs at that pace (at most, where early stopping
    may end it sooner)."""
    counts, epoch = result["photos"], result["epoch_seconds"]
    encoder = result["encoder"]
    photos = ", ".join(f"{c['images']:,} {split}" for split, c in counts.items() if c["images"])
    train = f"`train {result['recipe']}`"
    lines = header("step", "captioner ...", "time")
    lines.append(row(f"the photos ({photos}), their captions and the split, from files at hand (`--from`; without "
                     "it, the download comes first)", "`data flickr8k`", duration(result["prepare_seconds"])))
    lines.append(row(f"{ENCODER_NAMES.get(encoder, encoder)} features of the {result['cached_images']:,} photos, "
                     "cached once", f"{train}, first",
                     duration(result["cache_seconds"])))
    lines.append(row(f"one training epoch ({counts['train']['images']:,} photos, "
                     f"{result['precision']}) and its validation", f"{train}, then",
                     duration(epoch)))
    most = "at most " if result["early_stopping"] else ""
    lines.append(row(f"the recipe's {most}{result['recipe_epochs']} epochs at that pace", train,
                     duration(epoch * result["recipe_epochs"])))
    lines.append(row(f"scoring the {result['score_images']:,} {result['score_split']} photos",
                     f"`evaluate --split {result['score_split']}`", duration(result["score_seconds"])))
    lines.append(row(f"captioning {result['captioned_images']} photos of one's own, the model loaded",
                     "`caption`", duration(result["caption_seconds"])))
    return lines


def scst_diagnosis(result: dict) -> list[str]:
    """Cross-entropy starts and the SCST runs made from them (``scripts/scst_diagnosis.py``): what each changed,
    validation CIDEr per epoch, the SCST samples of its last epoch (mean reward, share cut at the length limit), and
    its best checkpoint on the validation photos with each decoding (the subset: the cross-entropy recipe's and the
    SCST recipe's; the full Flickr8k: the recipes' and greedy; and the recipe's with a logit adjustment or with
    ``decode.seen_endings`` where it was scored so), a row each, the run's own cells on its first, with the day of
    each run where they were measured on several (:func:`measured_on`). "Stops mid-phrase" is the share of captions
    that end where no training caption does (:func:`~captioner.evaluation.diversity.unseen_endings`; a dash for runs
    scored before it was measured). "Train CIDEr" is the first decoding's on the first photos the run was trained on
    (how many in brackets; a dash where not measured): how closely the checkpoint fits them."""
    lines = header("run", "differs from its recipe", "starts from", "val CIDEr by epoch (subset)",
                   "last epoch's samples: reward, cut", "decoding", "BLEU-4", "METEOR", "CIDEr", "distinct",
                   "words used", "mean length", "dangling end", "stops mid-phrase", "train CIDEr (photos)")
    for run in result["runs"]:
        shown_elsewhere = ("train.epochs", "train.val_max_images", "train.init_from", "train.log_every", "data.",
                           *(("model.",) if run.get("init_from") else ()))      # a start's model is its own
        changes = [c for c in run["changes"] if not c.startswith(shown_elsewhere)]
        samples = run.get("last_epoch_samples")
        start = "–"
        if run.get("init_from"):
            init = Path(run["init_from"])
            start = f"`{init.parent.name}`" if init.name == "best.pt" else f"`{init.parent.name}/{init.name}`"
        measured = measured_on(run, result)
        first = next(iter(run["decoded"]))
        for position, (mode, scored) in enumerate(run["decoded"].items()):
            named = (f"`{run['run']}`{measured}", ", ".join(f"`{c}`" for c in changes) or "–", start,
                     ", ".join(number(point["CIDEr"]) for point in run["val_curve"]),
                f"{number(samples['reward'])}, {number(samples['cut_share'], 2)}" if samples else "–")
            recipe, _, setting = mode.partition(", ")      # a recipe's decoding, with a setting changed
            shown = mode if mode == "greedy" else f"`{recipe}`'s" + (f", {setting}" if setting else "")
            lines.append(row(*(named if position == 0 else ("",) * 5), shown,
                             number(scored["BLEU-4"]), number(scored["METEOR"]), number(scored["CIDEr"]),
                             number(scored["distinct_captions"], 2), scored["vocabulary_used"],
                             number(scored["mean_length"], 1), number(scored["dangling_end"], 3),
                             number(scored.get("unseen_end"), 3),
                             f"{number(fit['CIDEr'])} ({fit['images']:,})" if (fit := run.get("train_fit"))
                             and mode == fit.get("decoding", first) else "–"))
    return lines


def flickr8k_ensembles(result: dict) -> list[str]:
    """Ensembles of the Flickr8k study's runs (``scripts/flickr8k_ensemble.py``) on the 1,000 validation photos, with
    the CPU time their members took to train together."""
    lines = header("members", *METRICS, "words used", "distinct", "members' train CPU min")
    for entry in result["ensembles"].values():
        lines.append(row(" + ".join(f"`{m}`" for m in entry["members"]),
                         *(number(entry["val"][m]) for m in METRICS),
                         entry["diversity"]["vocabulary_used"], number(entry["diversity"]["distinct_captions"], 2),
                         number(entry["members_train_cpu_seconds"] / 60, 0)))
    return lines


def flickr8k_decoding(result: dict) -> list[str]:
    """The Flickr8k study's runs (and trials) decoded with other settings (``scripts/flickr8k_decoding.py``) on the
    1,000 validation photos: a row per run and setting, its CIDEr beside the recipe's own decoding of the same
    checkpoint, then for each recipe (or trial) and setting decoded on several seeds their mean ± half the range."""
    entries = sorted(result["runs"].values(), key=lambda e: (e["run"], e["decoding"] != "the recipe's", e["decoding"]))
    own = {e["run"]: e["val"]["CIDEr"] for e in entries if e["decoding"] == "the recipe's"}

    def gain(entry: dict) -> float | None:
        return entry["val"]["CIDEr"] - own[entry["run"]] if entry["run"] in own else None

    def signed(value: float | None) -> str:
        return "–" if value is None else f"{value:+.3f}"

    lines = header("run", "decoding", "BLEU-4", "METEOR", "CIDEr", "CIDEr gain", "words used", "distinct",
                   "mean length", "decode s")
    for e in entries:
        d = e["diversity"]
        lines.append(row(f"`{e['run']}`", e["decoding"], number(e["val"]["BLEU-4"]), number(e["val"]["METEOR"]),
                         number(e["val"]["CIDEr"]), signed(gain(e)), d["vocabulary_used"],
                         number(d["distinct_captions"], 2), number(d["mean_length"], 1),
                         number(e["decode_seconds"], 0)))
    groups: dict[tuple[str, str], list[dict]] = {}
    for e in entries:   # a recipe's seeds, or a trial's (the recipe with the same changes)
        trained = " ".join([f"`{e['recipe']}`", *(f"`{o}`" for o in e["trial"])])
        groups.setdefault((trained, e["decoding"]), []).append(e)

    for (trained, decoding), group in groups.items():
        if len(group) < 2:
            continue
        gains = [gain(e) for e in group]
        mean_gain = None if decoding == "the recipe's" or None in gains else sum(gains) / len(gains)
        lines.append(row(f"{trained}, mean of {len(group)} seeds", decoding,
                         *(mean_spread([e["val"][m] for e in group]) for m in ("BLEU-4", "METEOR", "CIDEr")),
                         signed(mean_gain),
                         mean_spread([e["diversity"]["vocabulary_used"] for e in group], 0),
                         "", "", ""))
    return lines


def cuda_check(result: dict) -> list[str]:
    """``scripts/cuda_check.sh`` on a GPU machine: each step's exit status and time, with what it measured."""
    training, bench = result["training"], result["benchmarks"]

    def epochs(name: str) -> str:
        run = training[name]
        speeds = ", ".join(f"{e['words_per_s']:,}" for e in run["epochs"])
        return (f"{run['precision']}, compile {run['compile']}: words/s by epoch {speeds}; "
                f"val CIDEr {run['epochs'][-1]['CIDEr']:.3f}")

    def ratios(size: str) -> str:
        found = bench["lstm_decoder"]["training"][size]["ratio_to_tutorial"]
        return ", ".join(f"{kind} {found[kind]['median']:.2f}x" for kind in ("fp32", "compiled", "bf16"))

    measured = {name: epochs(name) for name in training}
    if "lstm_decoder" in bench:
        beam = bench["lstm_decoder"]["beam_images_per_s"]
        measured["bench_decoder"] = (f"training words/s against the tutorial's step: D = 512 {ratios('D=512')}; "
                                     f"D = 2048 {ratios('D=2048')}; beam 3 on 32 images {beam['k=3,batch=32']:,.0f} "
                                     "images/s")
    if "demo_soft" in result:
        demo = result["demo_soft"]
        measured["demo_soft"] = (f"test BLEU-4 {demo['BLEU-4']:.3f}, CIDEr {demo['CIDEr']:.3f}; {demo['epochs']} "
                                 f"epochs in {demo['train_seconds']:.0f} s at {demo['words_per_s']:,} words/s")
    for compiled, scores in result.get("decode_compile", {}).items():
        measured[f"evaluate_decode_compile_{compiled}"] = (f"test BLEU-4 {scores['BLEU-4']:.3f}, CIDEr "
                                                           f"{scores['CIDEr']:.3f} on {scores['images']} images")
    if "scaling" in bench:
        by_batch = bench["scaling"]["training_by_batch"]
        measured["bench_scaling"] = "training words/s at B = 64: " + ", ".join(
            f"{name.removesuffix(' B=64')} {value['words_per_s']:,.0f}" for name, value in by_batch.items()
            if name.endswith("B=64"))
    if "feature_cache" in bench:
        measured["bench_feature_cache"] = f"images/s caching {bench['feature_cache']['images']} images: " + "; ".join(
            f"{setting} {speed:,.0f}" for setting, speed in bench["feature_cache"]["images_per_s"].items())
    lines = header("step", "exit", "s (limit)", "measured")
    for name, step in result["steps"].items():
        lines.append(row(f"`{name}`", step["exit"], f"{step['seconds']} ({step['limit']})", measured.get(name, "–")))
    return lines


TABLES: dict[str, Callable[[dict], list[str]]] = {
    "demo": demo, "scaling": scaling, "scst": scst, "decode_beside_python": decode_beside_python,
    "flickr8k_full": flickr8k_full, "hard_attention_snr": hard_attention_snr, "hard_attention_runs": hard_attention_runs,
    "recipe_times": recipe_times, "flickr8k_ensembles": flickr8k_ensembles, "own_photos": own_photos,
    "scst_diagnosis": scst_diagnosis, "scst_diagnosis_full": scst_diagnosis, "cuda_check": cuda_check,
    "marginal_attention": marginal_attention, "flickr8k_trials": flickr8k_trials,
    "recipe_speed": recipe_speed, "process_setup": process_setup, "engine_step": engine_step,
    "flickr8k_decoding": flickr8k_decoding}
