"""Results cannot go stale: every results table in README.md and docs/ is what its JSON under benchmarks/results/
renders (a number edited by hand fails), and every result was measured with its recipe and code as they are now
(the SHA-256 of each input it records)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "scripts")]
from render_results import TABLE, differences, pages, render_page  # noqa: E402
from results import add_entry, load_results, stale_inputs, write_result  # noqa: E402

RECORDS = load_results()
MACHINE_KEYS = {"cpu", "cpu_flags", "cores", "threads", "gpu", "torch", "date", "commit"}


@pytest.mark.parametrize("page", list(pages()), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_results_table_is_what_its_json_renders(page):
    text = page.read_text()
    assert render_page(text, RECORDS, pages()[page]) == text, (
        f"{page.relative_to(ROOT)}: a results table differs from its JSON; tables are rendered, never edited: "
        "python scripts/render_results.py")


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_result_was_measured_with_its_recipe_and_code_as_they_are(name):
    record = RECORDS[name]
    assert MACHINE_KEYS <= set(record["machine"]), f"{name}: machine block lacks {MACHINE_KEYS - set(record['machine'])}"
    assert record["inputs"], f"{name}: names no recipe or code it depends on"
    stale = stale_inputs(record)
    assert not stale, f"{name}.json was measured with other versions of {stale}; run again: {record['command']}"


def test_the_docs_show_the_demo_table_in_the_readme_and_on_the_results_page():
    shown = {page.relative_to(ROOT).as_posix(): {m["name"] for m in TABLE.finditer(page.read_text())}
             for page in pages()}
    assert "demo" in shown["README.md"] and "demo" in shown["docs/results.md"]


@pytest.fixture
def copy_with_a_result(tmp_path):
    """A repository-like folder with the demo's soft recipe, a result that names it and a page showing its table."""
    recipe = "captioner/configs/demo_soft.yaml"
    (tmp_path / recipe).parent.mkdir(parents=True)
    (tmp_path / recipe).write_bytes((ROOT / recipe).read_bytes())
    results = tmp_path / "benchmarks" / "results"
    scores = {"BLEU-1": 0.95, "BLEU-4": 0.81, "METEOR": 0.489, "ROUGE-L": 0.868, "CIDEr": 4.89,
              "object_precision": 0.915, "relation_accuracy": 0.821, "pointing_accuracy": 0.896, "epochs": 15,
              "train_seconds": 213.0, "done_after_seconds": 247.0}
    write_result("demo", {"runs": {"soft": scores}, "feature_seconds": 12.0, "figures_after_seconds": 249.0,
                          "total_seconds": 604.0}, inputs=[recipe], command="captioner demo", results_dir=results)
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text("# Results\n\n<!-- results:demo -->\n<!-- /results:demo -->\n")
    page.write_text(render_page(page.read_text(), load_results(results), dated=True))
    return tmp_path, results, page


def test_a_rendered_table_passes_the_check(copy_with_a_result):
    root, results, page = copy_with_a_result
    assert "| `soft` | 0.950 | 0.810 |" in page.read_text()
    assert differences(root, results) == []


def test_a_number_edited_by_hand_fails_the_check(copy_with_a_result):
    root, results, page = copy_with_a_result
    page.write_text(page.read_text().replace("| 0.810 |", "| 0.820 |"))
    found = differences(root, results)
    assert len(found) == 1 and "docs/results.md: a results table differs" in found[0] and "0.820" in found[0]


def test_a_changed_recipe_makes_its_result_stale(copy_with_a_result):
    root, results, _ = copy_with_a_result
    recipe = root / "captioner/configs/demo_soft.yaml"
    recipe.write_text(recipe.read_text() + "# one more line\n")
    found = differences(root, results)
    assert len(found) == 1 and "demo.json: measured with other versions of captioner/configs/demo_soft.yaml" in found[0]
    assert stale_inputs(json.loads((results / "demo.json").read_text()), root) == ["captioner/configs/demo_soft.yaml"]


def test_a_table_without_a_result_fails_the_check(copy_with_a_result):
    root, results, page = copy_with_a_result
    page.write_text(page.read_text() + "\n<!-- results:nowhere -->\n<!-- /results:nowhere -->\n")
    assert differences(root, results) == ["docs/results.md: results table 'nowhere' has no result: no results/nowhere.json"]


def test_recipe_times_names_the_cpu_with_its_threads_and_a_gpu_by_its_name():
    from tables import recipe_times

    machine = {"cpu": "Some CPU", "cores": 2, "threads": 2}
    timed = {"recipe": "flickr8k_full_soft", "precision": True, "epochs": 12, "train_seconds": 1560.0,
             "score_seconds": 15.0, "load_before": [0.1, 0.2, 0.3], "val_cider": 0.468}
    lines = recipe_times({"entries": {
        "on cpu": {**timed, "device": "cpu", "machine": machine},
        "on gpu": {**timed, "device": "NVIDIA H100", "precision": False, "train_seconds": 120.0, "machine": machine}}})
    assert lines[2] == ("| `flickr8k_full_soft` | Some CPU, 2 cores, 2 torch threads | bf16 | 12 | 26.0 | 0.2 | 26.2 "
                        "| 0.10 | 0.468 |")
    assert lines[3].startswith("| `flickr8k_full_soft` | NVIDIA H100 | float32 | 12 | 2.0 | 0.2 | 2.2 |")


def test_an_added_entry_sits_beside_those_before_each_with_its_machine(tmp_path):
    recipe = "captioner/configs/demo_soft.yaml"
    add_entry("timed", "entries", "b", {"seconds": 2.0}, inputs=[recipe], results_dir=tmp_path)
    add_entry("timed", "entries", "a", {"seconds": 1.0}, inputs=[recipe], results_dir=tmp_path)
    entries = json.loads((tmp_path / "timed.json").read_text())["result"]["entries"]
    assert list(entries) == ["a", "b"] and entries["b"]["seconds"] == 2.0
    assert all(MACHINE_KEYS <= set(entry["machine"]) for entry in entries.values())
