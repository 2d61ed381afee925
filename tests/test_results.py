"""Results cannot go stale: every results table in README.md and docs/ is what its JSON under benchmarks/results/
renders (a number edited by hand fails), and every result was made with the settings and the code behaviour it
records (a changed setting or a probe that computes other numbers fails, naming the result and why), while code
that moves or a recipe's paths and comments do not."""

import json
from pathlib import Path

import pytest

from captioner.checkpoint import save_checkpoint
from captioner.config import load_config, recipes
from captioner.decoding.search import DecodeConfig
from captioner.errors import CaptionerError
from captioner.results import fingerprint
from captioner.results.record import (add_entry, entries_made_otherwise, load_results, made_by, override_text, pin,
                                      pinned_key, reprobe, result_settings, save, settings_changes, why_stale,
                                      write_result)
from captioner.results.render import TABLE, pages, render_page, stale_results, table_differences

ROOT = Path(__file__).resolve().parent.parent
RECORDS = load_results()
MACHINE_KEYS = {"cpu", "cpu_flags", "cores", "threads", "gpu", "torch", "date", "commit"}


@pytest.mark.parametrize("page", list(pages()), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_results_table_is_what_its_json_renders(page):
    text = page.read_text()
    assert render_page(text, RECORDS, pages()[page]) == text, (
        f"{page.relative_to(ROOT)}: a results table differs from its JSON; tables are rendered, never edited: "
        "python scripts/render_results.py")


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_result_was_made_by_the_settings_and_code_as_they_are(name):
    record = RECORDS[name]
    assert MACHINE_KEYS <= set(record["machine"]), f"{name}: machine block lacks {MACHINE_KEYS - set(record['machine'])}"
    assert record["settings"] and record["fingerprint"], f"{name}: records no settings or no probe of the code"
    reasons = why_stale(record)
    assert not reasons, f"{name}.json is stale: {'; '.join(reasons)}; run it again: {record['command']}"


def test_the_docs_show_the_demo_table_in_the_readme_and_on_the_results_page():
    shown = {page.relative_to(ROOT).as_posix(): {m["name"] for m in TABLE.finditer(page.read_text())}
             for page in pages()}
    assert "demo" in shown["README.md"] and "demo" in shown["docs/results.md"]


SCORES = {"BLEU-1": 0.95, "BLEU-4": 0.81, "METEOR": 0.489, "ROUGE-L": 0.868, "CIDEr": 4.89, "object_precision": 0.915,
          "relation_accuracy": 0.821, "pointing_accuracy": 0.896, "epochs": 15, "train_seconds": 213.0,
          "done_after_seconds": 247.0}
PROBES = ["text", "train demo_soft data.features=features"]


@pytest.fixture
def copy_with_a_result(tmp_path):
    """A repository-like folder with a result made by the demo's soft recipe and a page showing its table."""
    results = tmp_path / "benchmarks" / "results"
    write_result("demo", {"runs": {"soft": SCORES}, "feature_seconds": 12.0, "figures_after_seconds": 249.0,
                          "total_seconds": 604.0}, configs=["demo_soft"], probes=PROBES, command="captioner demo",
                 results_dir=results)
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text("# Results\n\n<!-- results:demo -->\n<!-- /results:demo -->\n")
    page.write_text(render_page(page.read_text(), load_results(results), dated=True))
    return tmp_path, results, page


def test_a_rendered_table_passes_the_check(copy_with_a_result):
    root, results, page = copy_with_a_result
    assert "| `soft` | 0.950 | 0.810 |" in page.read_text()
    assert table_differences(root, results) == [] and stale_results(results) == []


def test_a_number_edited_by_hand_fails_the_check(copy_with_a_result):
    root, results, page = copy_with_a_result
    page.write_text(page.read_text().replace("| 0.810 |", "| 0.820 |"))
    found = table_differences(root, results)
    assert len(found) == 1 and "docs/results.md: a results table differs" in found[0] and "0.820" in found[0]


def test_a_table_without_a_result_fails_the_check(copy_with_a_result):
    root, results, page = copy_with_a_result
    page.write_text(page.read_text() + "\n<!-- results:nowhere -->\n<!-- /results:nowhere -->\n")
    assert table_differences(root, results) == [
        "docs/results.md: results table 'nowhere' has no result: no results/nowhere.json"]


def test_the_settings_recorded_leave_out_paths_outputs_and_logs():
    settings = result_settings(fingerprint.ConfigRef("flickr8k_full_soft").load())
    assert {"train.lr", "model.lstm.attention", "decode.block_ngram", "data.vocab_min_count"} <= set(settings)
    assert not {"data.karpathy", "data.image_root", "data.features", "run.out", "train.wandb", "train.log_every",
                "train.init_from"} & set(settings)


def rewritten(results: Path, change) -> dict:
    """The demo result in ``results`` with ``change(record)`` applied, saved back."""
    record = json.loads((results / "demo.json").read_text())
    change(record)
    save(record, results)
    return record


def test_a_changed_setting_makes_its_result_stale_and_is_named(copy_with_a_result):
    _, results, _ = copy_with_a_result
    record = rewritten(results, lambda r: r["settings"]["demo_soft"].update({"train.lr": 0.001}))
    assert why_stale(record) == ["config 'demo_soft': train.lr 0.001 -> 0.002"]
    found = stale_results(results)
    assert len(found) == 1 and found[0].startswith("results/demo.json is stale: config 'demo_soft': train.lr")


def test_a_new_setting_at_its_default_keeps_the_result_and_one_away_from_it_does_not(copy_with_a_result):
    _, results, _ = copy_with_a_result
    record = rewritten(results, lambda r: [r["settings"]["demo_soft"].pop(k) for k in ("train.lr_gamma", "train.lr")])
    assert why_stale(record) == ["config 'demo_soft': train.lr is new and 0.002, not its default 0.0004"]


def test_reprobing_records_what_a_changed_probe_computes_and_only_where_the_settings_still_hold(copy_with_a_result):
    """After a probe itself changed (here: what it recorded edited), reprobe records what it computes now and names
    it, and the result is current again; a result whose settings changed is refused and left as it was."""
    _, results, _ = copy_with_a_result
    record = rewritten(results, lambda r: r["fingerprint"]["text"].update({"encoded": [1, 2, 3]}))
    assert why_stale(record) and reprobe(record) == ["text"]
    save(record, results)
    assert stale_results(results) == [] and record["fingerprint"]["text"] == fingerprint.compute("text")
    record = rewritten(results, lambda r: r["settings"]["demo_soft"].update({"train.lr": 0.001}))
    before = json.dumps(record)
    with pytest.raises(CaptionerError, match="demo: its settings changed, so no probe stands for it: config "
                                             "'demo_soft': train.lr 0.001 -> 0.002"):
        reprobe(record)
    assert json.dumps(record) == before


def test_a_recipes_paths_and_comments_keep_its_result():
    soft = fingerprint.ConfigRef("flickr8k_full_soft")
    moved = fingerprint.ConfigRef("flickr8k_full_soft", ("data.karpathy=/elsewhere/dataset_flickr8k.json",
                                                         "data.image_root=/elsewhere", "run.out=/tmp/x"))
    assert result_settings(soft.load()) == result_settings(moved.load())


def test_a_behaviour_change_makes_the_results_it_shapes_stale_naming_the_probe(tmp_path, monkeypatch):
    """One line of behaviour changed (the doubly stochastic term's scale): the result of a recipe that trains with
    the term goes stale, named with its probe and the numbers that moved; one whose recipe sets its weight to 0
    (the demo's) stays valid."""
    write_result("soft", {}, configs=["flickr8k_full_soft"], probes=["train flickr8k_full_soft"], results_dir=tmp_path)
    write_result("demo", {}, configs=["demo_soft"], probes=PROBES, results_dir=tmp_path)
    from captioner.objectives import losses

    term = losses.doubly_stochastic_term
    monkeypatch.setattr(losses, "doubly_stochastic_term", lambda *args, **kwargs: 2 * term(*args, **kwargs))
    monkeypatch.setattr(fingerprint, "_compute", fingerprint._compute.__wrapped__)     # no cached probe values
    monkeypatch.setattr(fingerprint, "_FITS", type(fingerprint._FITS)())                 # nor fitted models
    found = stale_results(tmp_path)
    assert len(found) == 1 and found[0].startswith(
        f"{tmp_path.name}/soft.json is stale: probe 'train flickr8k_full_soft' computes other numbers: steps.0.")
    assert "losses.attention: " in found[0] and "Run it again: python " in found[0]


def test_a_probe_agrees_within_the_tolerance_and_names_what_differs():
    recorded = {"steps": [{"losses": {"loss": 3.0}, "gradient_norms": [1.0, 0.5]}],
                "captions": [{"tokens": [4, 5], "log_prob": -1.0}]}
    close = {"steps": [{"losses": {"loss": 3.0 * (1 + 1e-5)}, "gradient_norms": [1.0, 0.5]}],
             "captions": [{"tokens": [5, 4], "log_prob": -1.0 + 1e-6}]}            # a tie: another caption, same score
    far = {"steps": [{"losses": {"loss": 3.01}, "gradient_norms": [1.0]}],
           "captions": [{"tokens": [5, 4], "log_prob": -0.9}]}
    assert fingerprint.differences(recorded, close) == []
    assert fingerprint.differences(recorded, far) == ["captions.0.tokens: [4, 5] -> [5, 4]",
                                                      "steps.0.gradient_norms: 2 items -> 1",
                                                      "steps.0.losses.loss: 3.0 -> 3.01"]


KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "DNNL_MAX_CPU_ISA": "SSE41"}
"""The narrowest vector kernels of torch, MKL and oneDNN, as a CPU without AVX runs them (ignored off x86)."""


@pytest.mark.parametrize("probe", ["decode flickr8k_full_transformer", "train flickr8k_full_hard"])
def test_a_probe_computes_the_same_numbers_with_another_cpus_kernels(probe):
    """A result measured on one CPU stays current on another: the probe that fits a Transformer for some Adam steps
    and the one that trains hard attention (sampled regions) agree within the tolerance between this CPU's kernels
    and the narrowest ones (in float32 they differed in the third digit between AVX2 and AVX-512)."""
    import os
    import subprocess
    import sys

    script = f"import json; from captioner.results.fingerprint import compute; print(json.dumps(compute({probe!r})))"
    done = subprocess.run([sys.executable, "-c", script], env=os.environ | KERNELS, capture_output=True, text=True,
                          check=True)
    assert fingerprint.differences(fingerprint.compute(probe), json.loads(done.stdout)) == []


def test_a_fit_kept_from_one_probe_serves_another_of_the_same_model_as_a_new_fit_would(monkeypatch):
    """Decode probes of one model that differ in their decoding share its fit, with the numbers of a new fit; a
    second fit after the first (an ensemble's second member of the same recipe) starts from another random state
    and is made anew."""
    monkeypatch.setattr(fingerprint, "_FITS", type(fingerprint._FITS)())
    uncached = fingerprint._compute.__wrapped__
    greedy = "decode demo_soft data.features=features decode.beam=1"
    uncached("decode demo_soft data.features=features")
    assert len(fingerprint._FITS) == 1
    served = uncached(greedy)
    assert len(fingerprint._FITS) == 1
    fingerprint._FITS.clear()
    assert uncached(greedy) == served
    config = fingerprint.ConfigRef.parse("demo_soft data.features=features").load()
    vocab = fingerprint.probe_vocabulary()
    with fingerprint.probe_conditions():
        fingerprint.fitted_model(config, vocab)
        fingerprint.fitted_model(config, vocab)                 # as an ensemble's second member of the same recipe
    assert len(fingerprint._FITS) == 2


def test_probes_run_in_float64_and_restore_the_default_dtype():
    import torch

    threads = torch.get_num_threads()
    with fingerprint.probe_conditions():
        assert torch.get_default_dtype() == torch.float64
    assert torch.get_default_dtype() == torch.float32
    uncached = fingerprint._compute.__wrapped__
    assert uncached("decode demo_transformer data.features=features")["captions"]
    assert torch.get_default_dtype() == torch.float32
    with pytest.raises(KeyError):
        uncached("decode no_such_recipe")                       # fails inside the probe's conditions
    assert torch.get_default_dtype() == torch.float32 and torch.get_num_threads() == threads


def test_recipe_times_names_the_cpu_with_its_widest_vectors_and_threads_and_a_gpu_by_its_name():
    from captioner.results.tables import recipe_times

    machine = {"cpu": "Some CPU", "cores": 2, "threads": 2}
    timed = {"recipe": "flickr8k_full_soft", "precision": "bf16", "epochs": 12, "train_seconds": 1560.0,
             "score_seconds": 15.0, "load_before": [0.1, 0.2, 0.3], "val_cider": 0.468}
    lines = recipe_times({"entries": {
        "on cpu": {**timed, "device": "cpu", "machine": machine},
        "on gpu": {**timed, "device": "NVIDIA V100", "precision": "fp16", "train_seconds": 120.0, "machine": machine}}})
    assert lines[2] == ("| `flickr8k_full_soft` | Some CPU, 2 cores, 2 torch threads | bf16 | 12 | 26.0 | 0.2 | 26.2 "
                        "| 0.10 | 0.468 |")
    assert lines[3].startswith("| `flickr8k_full_soft` | NVIDIA V100 | fp16 | 12 | 2.0 | 0.2 | 2.2 |")
    flagged = {**machine, "cpu_flags": ["avx", "avx2", "fma", "avx512f", "avx512_bf16"]}
    lines = recipe_times({"entries": {"on cpu": {**timed, "device": "cpu", "machine": flagged}}})
    assert "| Some CPU (avx512_bf16), 2 cores, 2 torch threads |" in lines[2]           # native bf16 or not
    flagged["cpu_flags"] = ["avx", "avx2", "fma"]
    lines = recipe_times({"entries": {"on cpu": {**timed, "device": "cpu", "machine": flagged}}})
    assert "| Some CPU (avx2), 2 cores, 2 torch threads |" in lines[2]


def test_own_photos_names_the_encoder_the_precision_and_says_at_most_where_early_stopping_may_end_sooner():
    from captioner.results.tables import own_photos

    counts = {"train": {"images": 6000}, "val": {"images": 1000}, "test": {"images": 0}}
    timed = {"recipe": "flickr8k_full_soft_lite2", "encoder": "efficientnet_lite2", "recipe_epochs": 8,
             "early_stopping": True, "precision": "float32", "photos": counts, "prepare_seconds": 3.1,
             "cache_seconds": 335.4, "cached_images": 7000, "epoch_seconds": 372.1, "score_split": "val",
             "score_images": 1000, "score_seconds": 33.3, "caption_seconds": 7.5, "captioned_images": 5}
    text = "\n".join(own_photos(timed))
    assert "| EfficientNet-Lite2 features of the 7,000 photos, cached once | `train flickr8k_full_soft_lite2`, first" \
           " | 5.6 min |" in text
    assert "one training epoch (6,000 photos, float32) and its validation" in text
    assert "(6,000 train, 1,000 val)" in text
    assert "| the recipe's at most 8 epochs at that pace | `train flickr8k_full_soft_lite2` | 50 min |" in text
    text = "\n".join(own_photos({**timed, "recipe": "flickr8k_full_soft", "encoder": "vgg19", "recipe_epochs": 12,
                                 "early_stopping": False, "precision": "bf16", "epoch_seconds": 130.0}))
    assert "| VGG-19 features" in text and "(6,000 photos, bf16)" in text
    assert "| the recipe's 12 epochs at that pace | `train flickr8k_full_soft` | 26 min |" in text


def test_the_transformer_words_recipe_is_probed_untied_as_its_run_trains():
    config = fingerprint.ConfigRef("flickr8k_full_transformer_scst_words").load()
    assert config.train.trainable == "output" and not config.model.transformer.tie_embeddings
    assert fingerprint.ConfigRef("flickr8k_full_transformer").load().model.transformer.tie_embeddings
    steps = fingerprint.compute("train flickr8k_full_transformer_scst_words")["steps"]
    assert [step["objective"] for step in steps] == ["xe"] * fingerprint.TRAIN_STEPS


def as_made_with(key: str, **changed) -> dict:
    """The settings of config ``key`` as a recipe that has changed since would have recorded them: ``changed``
    (``section__name=value``) where the recipe differs now."""
    recorded = result_settings(fingerprint.ConfigRef.parse(key).load())
    return {**recorded, **{name.replace("__", "."): value for name, value in changed.items()}}


def test_a_result_pinned_after_its_recipe_changed_names_the_settings_that_made_it():
    key = "demo_soft train.epochs=3"
    recorded = as_made_with(key, train__lr=0.001, train__lr_schedule="none")
    record = {"settings": {key: recorded, "demo_hard": as_made_with("demo_hard")},
              "fingerprint": {"text": {"n": 1}, f"train {key}": {"n": 2}, f"decode {key}": {"n": 3},
                              "data demo_soft": {"n": 4}, "train demo_hard": {"n": 5}},
              "result": {"entries": {"a": {"overrides": ["train.epochs=3", "run.seed=1"],
                                           "made_by": {"configs": [key], "probes": ["text", f"train {key}"]}},
                                     "b": {"made_by": {"configs": ["demo_hard"], "probes": ["train demo_hard"]}}}}}
    assert settings_changes(key, recorded)                      # stale, before
    pinned = "demo_soft train.epochs=3 train.lr=0.001 train.lr_schedule=none"
    assert pin(record, "demo_soft") == {key: pinned}
    assert settings_changes(pinned, recorded) == [] and list(record["settings"]) == [pinned, "demo_hard"]
    assert list(record["fingerprint"]) == ["text", f"train {pinned}", f"decode {pinned}", "data demo_soft",
                                           "train demo_hard"]          # the data probe reads the data section only
    assert record["fingerprint"][f"train {pinned}"] == {"n": 2}           # numbers kept: the check still runs them
    assert record["result"]["entries"]["a"]["made_by"] == {"configs": [pinned], "probes": ["text", f"train {pinned}"]}
    assert record["result"]["entries"]["a"]["overrides"] == ["train.epochs=3", "run.seed=1", "train.lr=0.001",
                                                             "train.lr_schedule=none"]        # what its table shows
    assert record["result"]["entries"]["b"]["made_by"] == {"configs": ["demo_hard"], "probes": ["train demo_hard"]}
    assert "overrides" not in record["result"]["entries"]["b"]
    assert pin(record, "demo_soft") == {}                                # pinned once, current after


def test_a_setting_new_since_is_pinned_to_its_default_and_a_setting_gone_cannot_be_pinned():
    key = "demo_soft"
    recorded = as_made_with(key)
    del recorded["train.lr_schedule"]                    # not a setting then: it ran as its default does now
    assert pinned_key(key, recorded) == "demo_soft train.lr_schedule=none"
    assert pinned_key(key, as_made_with(key)) == key
    assert pinned_key(key, {**as_made_with(key), "train.gone": 1}) is None


def test_an_override_pinned_reads_back_as_the_value_it_names():
    assert override_text("train.lr_schedule", "none") == "train.lr_schedule=none"
    assert override_text("run.out", "12") == 'run.out="12"'             # a bare 12 would read as a number
    assert override_text("train.lr", 0.0004) == "train.lr=0.0004"
    assert override_text("data.max_train_images", None) == "data.max_train_images=null"


def test_an_added_entry_sits_beside_those_before_each_with_its_machine(tmp_path):
    made = {"configs": ["demo_soft"], "probes": ["text"]}
    add_entry("timed", "entries", "b", {"seconds": 2.0}, results_dir=tmp_path, **made)
    add_entry("timed", "entries", "a", {"seconds": 1.0}, results_dir=tmp_path, **made)
    entries = json.loads((tmp_path / "timed.json").read_text())["result"]["entries"]
    assert list(entries) == ["a", "b"] and entries["b"]["seconds"] == 2.0
    assert all(MACHINE_KEYS <= set(entry["machine"]) for entry in entries.values())


def test_an_entry_made_otherwise_is_dropped_with_why(tmp_path, capsys):
    add_entry("timed", "entries", "b", {"seconds": 2.0}, configs=["demo_soft train.lr=0.1"], probes=["text"],
              results_dir=tmp_path)
    record = json.loads((tmp_path / "timed.json").read_text())
    record["settings"]["demo_soft train.lr=0.1"]["train.lr"] = 0.2
    save(record, tmp_path)
    add_entry("timed", "entries", "a", {"seconds": 1.0}, configs=["demo_soft"], probes=["text"], results_dir=tmp_path)
    assert list(json.loads((tmp_path / "timed.json").read_text())["result"]["entries"]) == ["a"]
    assert "dropping b: config 'demo_soft train.lr=0.1': train.lr 0.2 -> 0.1" in capsys.readouterr().err


def test_a_changed_config_drops_only_the_entries_it_made(tmp_path, capsys):
    add_entry("timed", "entries", "a", {"seconds": 1.0}, configs=["demo_soft"], probes=["text"], results_dir=tmp_path)
    add_entry("timed", "entries", "b", {"seconds": 2.0}, configs=["demo_hard"], probes=["text", "metrics"],
              results_dir=tmp_path)
    record = json.loads((tmp_path / "timed.json").read_text())
    assert list(record["settings"]) == ["demo_soft", "demo_hard"] and list(record["fingerprint"]) == ["text", "metrics"]
    assert record["result"]["entries"]["a"]["made_by"] == {"configs": ["demo_soft"], "probes": ["text"]}
    record["settings"]["demo_hard"]["train.lr"] = 0.5
    save(record, tmp_path)
    with pytest.raises(CaptionerError, match="b were made otherwise: config 'demo_hard': train.lr 0.5"):
        add_entry("timed", "entries", "c", {"seconds": 3.0}, configs=["demo_soft"], probes=["text"],
                  keep_stale=True, results_dir=tmp_path)
    add_entry("timed", "entries", "b", {"seconds": 2.5}, configs=["demo_hard"], probes=["text", "metrics"],
              keep_stale=True, results_dir=tmp_path)                # made again as the config is now: replaced
    record = json.loads((tmp_path / "timed.json").read_text())
    assert record["result"]["entries"]["b"]["seconds"] == 2.5 and why_stale(record) == []
    record["settings"]["demo_hard"]["train.lr"] = 0.5
    save(record, tmp_path)
    add_entry("timed", "entries", "c", {"seconds": 3.0}, configs=["demo_soft"], probes=["text"], results_dir=tmp_path)
    record = json.loads((tmp_path / "timed.json").read_text())
    assert list(record["result"]["entries"]) == ["a", "c"]
    assert "dropping b: config 'demo_hard'" in capsys.readouterr().err
    assert list(record["settings"]) == ["demo_soft"] and list(record["fingerprint"]) == ["text"]   # what made a and c
    assert why_stale(record) == []


def test_the_entries_made_otherwise_are_named_with_why_before_anything_is_added(tmp_path):
    add_entry("timed", "entries", "a", {"seconds": 1.0}, configs=["demo_soft"], probes=["text"], results_dir=tmp_path)
    add_entry("timed", "entries", "b", {"seconds": 2.0}, configs=["demo_hard"], probes=["text"], results_dir=tmp_path)
    assert entries_made_otherwise("timed", "entries", tmp_path) == {}
    assert entries_made_otherwise("untimed", "entries", tmp_path) == {}
    record = json.loads((tmp_path / "timed.json").read_text())
    record["settings"]["demo_hard"]["train.lr"] = 0.5
    save(record, tmp_path)
    found = entries_made_otherwise("timed", "entries", tmp_path)
    assert list(found) == ["b"] and found["b"][0].startswith("config 'demo_hard': train.lr 0.5 ->")


def test_a_study_run_refuses_to_start_beside_runs_made_otherwise_unless_restarted(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    study = load_script("flickr8k_study")
    monkeypatch.setattr(study, "record_made_by", lambda keys, probes: {"settings": {}, "fingerprint": {}})
    monkeypatch.setattr(study, "entries_made_otherwise",
                        lambda name, section: {"soft_s1": ["config 'flickr8k_full_soft': train.epochs 12 -> 8"],
                                               "soft_s0": ["its own entry: replaced"]})
    with pytest.raises(SystemExit, match=r"soft_s1 were made otherwise: config 'flickr8k_full_soft': train.epochs "
                                         r"12 -> 8; drop them with --restart"):
        study.run("soft", 0, False, [])
    started = []
    monkeypatch.setattr(study, "ensure_features", lambda *args: started.append(args) or 1 / 0)
    with pytest.raises(ZeroDivisionError):                   # restarted: on to its features, then training
        study.run("soft", 0, False, [], restart=True)
    assert started


def test_an_entry_saved_without_its_makers_was_made_by_all_its_results(tmp_path):
    add_entry("timed", "entries", "a", {"seconds": 1.0}, configs=["demo_soft", "demo_hard"], probes=["text"],
              results_dir=tmp_path)
    record = json.loads((tmp_path / "timed.json").read_text())
    del record["result"]["entries"]["a"]["made_by"]
    save(record, tmp_path)
    add_entry("timed", "entries", "b", {"seconds": 2.0}, configs=["demo_soft"], probes=["text"], results_dir=tmp_path)
    entries = json.loads((tmp_path / "timed.json").read_text())["result"]["entries"]
    assert entries["a"]["made_by"] == {"configs": ["demo_soft", "demo_hard"], "probes": ["text"]}


def test_made_by_names_each_config_and_probe():
    made = made_by(["demo_soft", "demo_hard model.lstm.hard_decode=sample"], ["text"])
    assert list(made["settings"]) == ["demo_soft", "demo_hard model.lstm.hard_decode=sample"]
    assert made["settings"]["demo_hard model.lstm.hard_decode=sample"]["model.lstm.hard_decode"] == "sample"
    assert list(made["fingerprint"]) == ["text"]


def load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_recipe_timed_on_another_cpu_keeps_the_timing_of_the_first(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    entry_key = load_script("recipe_time").entry_key
    timed = {"recipe": "demo_soft", "device": "cpu", "train_seconds": 60.0}
    keys = [entry_key(timed, {"cpu": "AMD EPYC", "cpu_flags": flags}) for flags in (["avx2"], ["avx2", "avx512_bf16"])]
    keys.append(entry_key(timed, {"cpu": "Intel(R) Xeon(R) Processor @ 2.80GHz", "cpu_flags": ["avx2", "avx512f"]}))
    assert keys == ["demo_soft on AMD EPYC (avx2)", "demo_soft on AMD EPYC (avx512_bf16)",
                    "demo_soft on Intel(R) Xeon(R) Processor @ 2.80GHz (avx512f)"]
    assert entry_key({**timed, "device": "NVIDIA H200"}, {"cpu": "AMD EPYC"}) == "demo_soft on NVIDIA H200"
    for key in keys:
        add_entry("timed", "entries", key, timed, configs=["demo_soft"], probes=["text"], results_dir=tmp_path)
    assert list(json.loads((tmp_path / "timed.json").read_text())["result"]["entries"]) == keys


def test_a_cuda_check_and_its_rerun_gather_into_one_result_with_the_gpu_machines_block(tmp_path):
    gather = load_script("cuda_check_result").gather
    first, rerun = tmp_path / "first", tmp_path / "rerun"
    first.mkdir(), rerun.mkdir()
    gpu = {"cpu": "a GPU host", "gpu": ["a GPU"]}
    (first / "steps.txt").write_text("bench_scaling: exit 0 in 20 s (limit 120 s)\n"
                                     "train_fp32: exit 1 in 9 s (limit 90 s)\n")
    (first / "scaling.json").write_text(json.dumps({"machine": gpu, "result": {"training_by_batch": {}}}))
    (first / "train_fp32.log").write_text("a traceback\n")
    (rerun / "steps.txt").write_text("bench_scaling: skipped (SKIP)\ntrain_fp32: exit 0 in 40 s (limit 90 s)\n")
    (rerun / "train_fp32.log").write_text(
        "INFO captioner.training.engine: precision: float32 (train.amp=false); compile: False\n"
        "epoch 1/2: BLEU-4 0.400 ROUGE-L 0.600 CIDEr 1.782 | 13184 words/s (best)\n"
        "epoch 2/2: BLEU-4 0.480 ROUGE-L 0.690 CIDEr 2.275 | 14357 words/s | 21 s training, 3 s validating (best)\n")
    payload, machine = gather([first, rerun])
    assert machine == gpu
    assert payload["steps"] == {"bench_scaling": {"exit": 0, "seconds": 20, "limit": 120},
                                "train_fp32": {"exit": 0, "seconds": 40, "limit": 90}}
    assert payload["training"]["train_fp32"] == {
        "precision": "float32 (train.amp=false)", "compile": False,
        "epochs": [{"epoch": 1, "CIDEr": 1.782, "words_per_s": 13184}, {"epoch": 2, "CIDEr": 2.275,
                                                                        "words_per_s": 14357}]}
    assert payload["benchmarks"] == {"scaling": {"training_by_batch": {}}}


def test_runs_merged_into_a_saved_diagnosis_keep_its_others_with_their_machine(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    merged = load_script("hard_attention_diagnosis").merged
    record = {"machine": {"date": "then"}, "result": {"runs": [{"run": "soft"}, {"run": "marginal", "old": True}]}}
    rows = [{"run": "marginal", "machine": {"date": "now"}}, {"run": "variational", "machine": {"date": "now"}}]
    assert merged(record, rows) == [{"run": "soft", "machine": {"date": "then"}}, *rows]
    kept = {"machine": {"date": "then"}, "result": {"runs": [{"run": "soft", "machine": {"date": "first"}}]}}
    assert merged(kept, [])[0]["machine"] == {"date": "first"}


def test_a_diagnosis_joins_a_saved_result_only_when_asked_and_only_its_current_rows(monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    script = load_script("hard_attention_diagnosis")
    monkeypatch.setattr(script, "RESULTS_DIR", tmp_path)
    (tmp_path / "diagnosis.json").write_text(json.dumps({"result": {"runs": []}}))
    monkeypatch.setattr(script, "stale_parts", lambda record: {})
    assert script.joined_record("diagnosis", merge=False) is None
    assert script.joined_record("another", merge=True) is None
    with pytest.raises(SystemExit, match="give --save NAME"):
        script.joined_record(None, merge=True)
    assert script.joined_record("diagnosis", merge=True) == {"result": {"runs": []}}
    changed = {"flickr8k_full_soft": ["config 'flickr8k_full_soft': train.epochs 12 -> 14"]}
    monkeypatch.setattr(script, "stale_parts", lambda record: changed)
    with pytest.raises(SystemExit, match="train.epochs 12 -> 14"):
        script.joined_record("diagnosis", merge=True)
    rows = [{"run": "soft", "recipe": "flickr8k_full_soft"}, {"run": "scst", "recipe": "flickr8k_full_soft_scst"}]
    (tmp_path / "diagnosis.json").write_text(json.dumps({"result": {"runs": rows}}))
    makers = lambda row: [row["recipe"], "metrics"]                     # noqa: E731
    assert script.joined_record("diagnosis", merge=True, row_makers=makers) == {"result": {"runs": rows[1:]}}
    dropped = "soft left out, made otherwise (config 'flickr8k_full_soft': train.epochs 12 -> 14)"
    assert dropped in capsys.readouterr().err
    monkeypatch.setattr(script, "stale_parts", lambda record: changed | {"metrics": ["probe 'metrics' changed"]})
    assert script.joined_record("diagnosis", merge=True, row_makers=makers) == {"result": {"runs": []}}
    monkeypatch.setattr(script, "stale_parts", lambda record: {"coco": ["config 'coco' changed"]})
    with pytest.raises(SystemExit, match="config 'coco' changed"):             # made no row: no row explains it
        script.joined_record("diagnosis", merge=True, row_makers=makers)


def test_a_diagnosis_table_dates_its_runs_only_where_they_were_measured_on_several_days():
    from captioner.results.tables import measured_on
    one_day = {"runs": [{"machine": {"date": "2026-11-28 20:32 UTC"}}, {"machine": {"date": "2026-11-28 21:05 UTC"}}]}
    assert measured_on(one_day["runs"][0], one_day) == ""
    two_days = {"runs": [*one_day["runs"], {"machine": {"date": "2026-11-29 15:18 UTC"}}]}
    assert [measured_on(run, two_days) for run in two_days["runs"]] == [" (2026-11-28)", " (2026-11-28)",
                                                                         " (2026-11-29)"]


def test_an_scst_diagnosis_keys_each_decoding_it_scored_by_its_settings(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    script = load_script("scst_diagnosis")
    recipe = load_config(recipes()["flickr8k_full_soft"]).to_dict()["decode"]
    adjusted = "flickr8k_full_soft, logit adjustment 0.3"
    assert list(script.decodings("full", [0.3])) == ["flickr8k_full_soft", "greedy", adjusted]
    assert script.decoding(adjusted, "full") == {**recipe, "logit_adjustment": 0.3}
    row = {"changes": [], "recipe": "flickr8k_full_soft", "decoded": {"flickr8k_full_soft": {}, adjusted: {}}}
    _, probes = script.made_by([row], "full")
    assert [p for p in probes if p.startswith("decode")] == [
        " ".join(["decode", "flickr8k_full_soft", *script.decode_overrides(decode)])
        for decode in (recipe, {**recipe, "logit_adjustment": 0.3})]
    seen = "flickr8k_full_soft, seen endings"
    assert list(script.decodings("full", [], seen_endings=True)) == ["flickr8k_full_soft", "greedy", seen]
    assert script.decoding(seen, "full") == {**recipe, "seen_endings": True}
    assert script.folder_name(seen) == "flickr8k_full_soft_seen_endings"
    saved_before = {k: v for k, v in recipe.items() if k != "seen_endings"}     # scored before the setting existed
    assert DecodeConfig(**recipe).same_as(saved_before)
    assert not DecodeConfig(**script.decoding(seen, "full")).same_as(saved_before)
    script.check_shared_decoding("full")           # the Transformer's recipes decode as the soft ones
    monkeypatch.setitem(script.STUDIES, "full", {**script.STUDIES["full"], "other": ("flickr8k_soft_scst",) * 2})
    with pytest.raises(SystemExit, match="flickr8k_soft_scst decodes unlike flickr8k_full_soft"):
        script.check_shared_decoding("full")


def test_an_scst_diagnosis_table_shows_every_decoding_of_a_run():
    from captioner.results.tables import scst_diagnosis
    scored = {"BLEU-4": 0.2, "METEOR": 0.19, "CIDEr": 0.5, "distinct_captions": 0.6, "vocabulary_used": 222,
              "mean_length": 9.0, "dangling_end": 0.0}
    run = {"run": "long", "changes": [], "val_curve": [{"epoch": 1, "CIDEr": 0.5}], "machine": {"date": "2026-11-29"},
           "decoded": {"flickr8k_full_soft": scored, "greedy": scored,
                       "flickr8k_full_soft, logit adjustment 0.2": {**scored, "vocabulary_used": 270}}}
    run["decoded"]["flickr8k_full_soft, seen endings"] = {**scored, "unseen_end": 0.0}
    lines = scst_diagnosis({"runs": [run]})[2:]
    assert len(lines) == 4 and lines[0].startswith("| `long` |") and lines[2].startswith("|  |")
    assert "| `flickr8k_full_soft`'s, logit adjustment 0.2 |" in lines[2] and "| 270 |" in lines[2]
    assert lines[2].endswith("| 0.000 | – | – |") and lines[3].endswith("| 0.000 | 0.000 | – |")  # not measured: a dash
    run["train_fit"] = {"images": 1000, "BLEU-4": 0.37, "CIDEr": 0.968}             # saved before it named its decoding
    lines = scst_diagnosis({"runs": [run]})[2:]
    assert lines[0].endswith("| 0.968 (1,000) |") and lines[1].endswith("| – |")     # on the first decoding's row
    run["train_fit"]["decoding"] = "greedy"
    lines = scst_diagnosis({"runs": [run]})[2:]
    assert lines[0].endswith("| – |") and lines[1].endswith("| 0.968 (1,000) |")     # on its decoding's row


def test_an_scst_diagnosis_scores_a_checkpoint_on_training_photos_once(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    script = load_script("scst_diagnosis")
    checkpoint = tmp_path / "run" / "cross_entropy.pt"
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"")
    calls = []

    def evaluate(path, split, out_dir, progress, overrides):
        calls.append((path, split, overrides))
        out_dir.mkdir(parents=True, exist_ok=True)
        scores = {"images": 3, "BLEU-4": 0.31234, "CIDEr": 0.91234, "overrides": overrides,
                  "decode": {**decode, **{o.split("=")[0][7:]: json.loads(o.split("=")[1])
                                         for o in overrides if o.startswith("decode.")}},
                  "checkpoint_sha256": [script.checkpoint_digest(path)]}
        (out_dir / "scores_train.json").write_text(json.dumps(scores))
        return scores

    monkeypatch.setattr(script, "evaluate_checkpoint", evaluate)
    decode = next(iter(script.decodings("full").values()))
    fit = script.train_fit(checkpoint, checkpoint.parent, 3, decode)
    assert fit == {"images": 3, "BLEU-4": 0.3123, "CIDEr": 0.9123}
    assert calls == [(checkpoint, "train", ["data.max_train_images=3", *script.decode_overrides(decode)])]
    assert (tmp_path / "run" / "train_cross_entropy_3" / "scores_train.json").exists()
    assert script.train_fit(checkpoint, checkpoint.parent, 3, decode) == fit and len(calls) == 1   # kept
    script.train_fit(checkpoint, checkpoint.parent, 5, decode)                                     # other photos
    script.train_fit(checkpoint, checkpoint.parent, 5, decode)
    assert len(calls) == 2 and calls[1][2][0] == "data.max_train_images=5"
    script.train_fit(checkpoint, checkpoint.parent, 3, {**decode, "beam": 1})                      # another decoding
    assert len(calls) == 3
    checkpoint.write_bytes(b"trained further")                                                     # another model
    script.train_fit(checkpoint, checkpoint.parent, 3, {**decode, "beam": 1})
    assert len(calls) == 4
    scored = tmp_path / "run" / "train_cross_entropy_3" / "scores_train.json"
    made_otherwise = json.loads(scored.read_text())
    scored.write_text(json.dumps({**made_otherwise, "overrides": ["data.max_train_images=3", "encoder.name=vgg19"]}))
    script.train_fit(checkpoint, checkpoint.parent, 3, {**decode, "beam": 1})                      # other data
    assert len(calls) == 5


def test_the_study_table_sets_each_scst_run_against_its_own_cross_entropy_start():
    from captioner.results.tables import flickr8k_full

    def scored(cider: float, words: int) -> dict:
        return {"val": {"CIDEr": cider}, "diversity": {"vocabulary_used": words}}

    def run(recipe: str, seed: int, cider: float, words: int, **more) -> dict:
        return {"recipe": recipe, "ablation": False, "seed": seed, **scored(cider, words), **more}

    runs = {"scst_s0": run("scst", 0, 0.55, 150, start=scored(0.50, 300)),
            "scst_s1": run("scst", 1, 0.63, 200, start=scored(0.60, 200)),
            "words_s0": run("words", 0, 0.54, 270, after="scst_s0"),          # against scst_s0's start
            "words_s1": run("words", 1, 0.66, 180, after="scst_s1"),
            "scst_s2": run("scst", 2, 0.60, 100),                            # saved without its start
            "xe_s0": run("xe", 0, 0.50, 300)}
    lines = flickr8k_full({"runs": runs})
    column = lines[0].split(" | ").index("CIDEr gain, words kept (against its cross-entropy start)")
    cell = {line.split(" | ")[0].strip("| `"): line.split(" | ")[column] for line in lines[2:]}
    assert cell["scst"] == "7.5 ± 2.5 %, 75 ± 25 % (2 of 3 seeds)"   # +10 % and +5 %; 50 % and 100 % of the words
    assert cell["words"] == "9.0 ± 1.0 %, 90 ± 0 %"              # +8 % and +10 %
    assert cell["xe"] == cell["scst`: its cross-entropy start"] == "–"


def test_a_study_run_that_fine_tunes_another_is_made_by_both_and_waits_for_it(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    study = load_script("flickr8k_study")
    keys, probes = study.made_by("transformer_scst_words", False)
    assert keys == ["flickr8k_full_transformer_scst_words", "flickr8k_full_transformer_scst"]
    assert "train flickr8k_full_transformer_scst" in probes and len(probes) == len(set(probes))
    monkeypatch.setattr(study, "RUNS", tmp_path)            # no run of that seed here, and none saved
    monkeypatch.setattr(study, "load_results", lambda: {})
    with pytest.raises(SystemExit, match="transformer_scst_s7: .* not trained and saved yet: python scripts/"
                                         "flickr8k_study.py transformer_scst --seed 7"):
        study.run("transformer_scst_words", 7, False, [])
    saved = {study.RESULTS: {"result": {"runs": {"transformer_scst_s7": {}}}}}
    monkeypatch.setattr(study, "load_results", lambda: saved)          # saved, on another machine
    with pytest.raises(SystemExit, match="which is not on this machine"):
        study.run("transformer_scst_words", 7, False, [])


def test_a_decoding_sweep_keys_each_entry_by_the_runs_training_and_its_decoding_and_refuses_runs_made_otherwise(
        monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    sweep = load_script("flickr8k_decoding")
    trial = {"run": "soft_s2_ema", "recipe": "flickr8k_full_soft", "kind": "soft", "ablation": False, "seed": 2,
             "overrides": ["run.seed=2", "train.ema_decay=0.999"], "best_val_metric": {"CIDEr": 0.5271}}
    saved = {"flickr8k_trials": {"result": {"runs": {"soft_s2_ema": trial,
                                                     "soft_none_s0": {**trial, "ablation": True}}}}}
    (tmp_path / "soft_s2_ema").mkdir()
    best = tmp_path / "soft_s2_ema" / "best.pt"
    save_checkpoint({"model": {}, "vocab": {}, "config": {}, "progress": {"best": 0.52712}}, best)
    monkeypatch.setattr(sweep, "RUNS", tmp_path)
    monkeypatch.setattr(sweep, "load_results", lambda: saved)
    monkeypatch.setattr(sweep, "entries_made_otherwise", lambda name, section: {})
    scores = {"images": 1000, **{m: 0.5 for m in sweep.METRICS},
              "diversity": {"vocabulary_used": 300, "distinct_captions": 0.8, "mean_length": 9.5}}
    decoded, added = [], []
    monkeypatch.setattr(sweep, "evaluate_checkpoint", lambda checkpoint, split, **kw: decoded.append(kw) or scores)
    monkeypatch.setattr(sweep, "add_entry", lambda *args, **kw: added.append((args, kw)))
    sweep.decode("soft_s2_ema", *sweep.study_entry("soft_s2_ema"), "beam 5, length penalty 0.5")
    assert decoded[0]["overrides"] == ["decode.beam=5", "decode.length_penalty=0.5"]
    (name, section, key, entry), made = added[0]
    assert (name, section, key) == ("flickr8k_decoding", "runs", "soft_s2_ema | beam 5, length penalty 0.5")
    assert entry["trial"] == ["train.ema_decay=0.999"] and entry["source"] == "flickr8k_trials"
    assert made["configs"] == ["flickr8k_full_soft train.ema_decay=0.999",
                               "flickr8k_full_soft train.ema_decay=0.999 decode.beam=5 decode.length_penalty=0.5"]
    assert "train flickr8k_full_soft train.ema_decay=0.999" in made["probes"]
    assert made["probes"][-1] == "decode flickr8k_full_soft train.ema_decay=0.999 decode.beam=5 decode.length_penalty=0.5"
    with pytest.raises(SystemExit, match="soft_none_s0: an ablation"):
        sweep.study_entry("soft_none_s0")
    with pytest.raises(SystemExit, match="soft_s9: no such run"):
        sweep.study_entry("soft_s9")
    save_checkpoint({"model": {}, "vocab": {}, "config": {}, "progress": {"best": 0.5302}}, best)   # trained again
    with pytest.raises(SystemExit, match="best.pt: not the checkpoint of the run saved in flickr8k_trials.json"):
        sweep.study_entry("soft_s2_ema")
    monkeypatch.setattr(sweep, "entries_made_otherwise",
                        lambda name, section: {"soft_s2_ema": ["config 'flickr8k_full_soft': train.epochs 12 -> 8"]})
    with pytest.raises(SystemExit, match="made otherwise than its recipe now says .*train.epochs 12 -> 8"):
        sweep.study_entry("soft_s2_ema")


def test_the_decoding_table_sets_each_setting_against_the_recipes_own_decoding_of_the_same_checkpoint():
    from captioner.results.tables import flickr8k_decoding

    def entry(run, decoding, cider, words, trial=()):
        return {"run": run, "recipe": "flickr8k_full_soft", "trial": list(trial), "seed": int(run[-1]),
                "decoding": decoding, "decode_seconds": 60.0, "val": {"BLEU-4": 0.2, "METEOR": 0.19, "CIDEr": cider},
                "diversity": {"vocabulary_used": words, "distinct_captions": 0.8, "mean_length": 9.6}}

    runs = [entry("soft_s0", "the recipe's", 0.46, 240), entry("soft_s0", "beam 5", 0.48, 250),
            entry("soft_s1", "the recipe's", 0.50, 350), entry("soft_s1", "beam 5", 0.51, 360),
            entry("soft_s2", "beam 5", 0.40, 100, ["train.ema_decay=0.999"])]
    lines = flickr8k_decoding({"runs": {f"{e['run']} | {e['decoding']}": e for e in runs}})
    assert lines[2].startswith("| `soft_s0` | the recipe's |") and "| +0.000 |" in lines[2]
    assert lines[3].startswith("| `soft_s0` | beam 5 |") and "| +0.020 |" in lines[3]
    assert "| – |" in lines[6]                                         # no recipe's decoding of that run
    assert lines[7] == "| `flickr8k_full_soft`, mean of 2 seeds | the recipe's | 0.200 ± 0.000 | 0.190 ± 0.000 | " \
                       "0.480 ± 0.020 | – | 295 ± 55 |  |  |  |"
    assert lines[8].startswith("| `flickr8k_full_soft`, mean of 2 seeds | beam 5 |") and "| +0.015 |" in lines[8]
    assert len(lines) == 9                                             # one seed of the trial: no mean row


def test_a_study_finishes_a_feature_cache_left_unfinished_and_leaves_a_finished_one(monkeypatch, tmp_path):
    import numpy as np

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    study = load_script("flickr8k_study")
    calls = []
    monkeypatch.setattr(study.subprocess, "run", lambda command, check: calls.append(command))
    cache = tmp_path / "features"
    cache.mkdir()
    (cache / "meta.json").write_text(json.dumps({"image_ids": [1, 2], "grid": [1, 1], "feature_dim": 2,
                                                 "dtype": "float16"}))
    np.save(cache / "features.npy", np.zeros((2, 1, 2), np.float16))
    np.save(cache / "status.npy", np.array([1, 0], np.uint8))               # the second image not written yet
    study.ensure_features(Path("flickr8k_full_soft.yaml"), str(cache), [], ["train", "val"])
    assert len(calls) == 1 and "cache-features" in calls[0] and f"data.features={cache}" in calls[0]
    np.save(cache / "status.npy", np.array([1, 2], np.uint8))               # written, and one unreadable
    study.ensure_features(Path("flickr8k_full_soft.yaml"), str(cache), [], ["train", "val"])
    assert len(calls) == 1
