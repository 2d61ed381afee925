"""The docs site builds as `make docs` builds it (`mkdocs build --strict`: a broken link, a missing page or an
unresolved reference fails), its generated reference lists every command, option, setting and shipped recipe, and
the README and the guide pages carry no commit hashes, dates or "today": figures that go stale live in
benchmarks/results/ and on the results page (tests/test_results.py)."""

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from captioner.cli import build_parser
from captioner.config import config_reference, recipes
from captioner.version import __version__

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from docs_reference import GENERATORS, commands  # noqa: E402

# The pages whose prose must not date: the README and every docs page but the results page (which names each
# result's machine and date once, from its JSON), the changelog (history) and the architecture map.
UNDATED = [ROOT / "README.md", *(page for page in sorted((ROOT / "docs").rglob("*.md"))
                                 if page.name not in ("results.md", "changelog.md", "architecture.md"))]
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b(19|20)\d\d-\d\d-\d\d\b")
TODAY = re.compile(r"\btoday\b", re.I)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built by `mkdocs build --strict`, as `make docs` builds it."""
    pytest.importorskip("mkdocs", reason="the docs tools are in the dev extra (make setup installs them)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr}"
    return out


def built(page: str) -> str:
    """Where the page ``page`` of docs/ (``guides/training.md``) is in the built site: pages are at ``/NAME/``
    URLs (``use_directory_urls``), so ``guides/training/index.html``; ``index.md`` is ``index.html``."""
    name = page.removesuffix(".md")
    return "index.html" if name == "index" else f"{name.removesuffix('/index')}/index.html"


def page_text(site: Path, page: str) -> str:
    """The text of a built page (``reference/cli.md``), without its tags."""
    return html.unescape(re.sub(r"<[^>]+>", "", (site / built(page)).read_text()))


def test_the_site_builds_with_every_page_of_the_navigation(site):
    navigation = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(entries):
        for entry in entries:
            for value in entry.values():
                yield from (pages(value) if isinstance(value, list) else [value])

    for page in pages(navigation):
        assert (site / built(page)).is_file(), page


def test_the_command_line_reference_lists_every_command_and_option(site):
    text = page_text(site, "reference/cli.md")
    for names, _, parser in commands(build_parser()):
        assert f"captioner {' '.join(names)}" in text
        flags = {flag for action in parser._actions if not isinstance(action, argparse._HelpAction)
                 for flag in action.option_strings}
        section = text.split(f"captioner {' '.join(names)}¶", 1)[1].split("¶", 1)[0]
        missing = [flag for flag in flags if flag not in section]
        assert not missing, f"captioner {' '.join(names)}: {missing} missing from the generated reference"


def test_the_configuration_page_lists_every_shipped_recipe_and_every_setting(site):
    text = page_text(site, "reference/configuration.md")
    assert len(recipes()) >= 13
    missing = [name for name in recipes() if name not in text]
    assert not missing, f"recipes missing from the configuration page: {missing}"
    settings = re.findall(r"^\| `([a-z_.]+)` \|", config_reference(), flags=re.M)
    assert settings and not [setting for setting in settings if setting not in text]


def table_cells(row: str) -> tuple[list[str], bool]:
    """The cells of a Markdown table row as Python-Markdown splits them (a ``|`` inside a code span or escaped
    is text), and whether every code span in it is closed."""
    cells, cell, in_code, i = [], "", False, 0
    while i < len(row):
        char = row[i]
        if char == "\\" and i + 1 < len(row):
            cell, i = cell + row[i:i + 2], i + 2
            continue
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
        i += 1
    cells.append(cell.strip())
    return cells[1:-1] if row.startswith("|") and row.rstrip().endswith("|") else cells, not in_code


def table_faults(markdown: str) -> list[str]:
    """Every row of every table in ``markdown`` with a code span left open or a number of cells other than its
    header's."""
    faults, header = [], None
    for line in markdown.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells, closed = table_cells(line)
        header = header or cells
        if not closed:
            faults.append(f"a code span left open: {line}")
        elif "``" in line:
            faults.append(f"an empty code span (shown as two backticks): {line}")
        elif len(cells) != len(header):
            faults.append(f"{len(cells)} cells, the header {len(header)}: {line}")
    return faults


def test_the_table_check_finds_a_code_span_cut_open():
    header = "| recipe | what it trains | model | epochs | `train.amp` |\n|---|---|---|---|---|\n"
    assert not table_faults(header + "| `demo` | Main job (`make demo`), \\| cut... | LSTM | 15 | `false` |")
    assert table_faults(header + "| `demo` | starts from (set by `captioner... | LSTM | 15 | `false` |")
    assert table_faults(header + "| `demo` | a cell | LSTM | `false` |")
    assert table_faults(header + "| `demo` | a cell | LSTM | `` | `false` |")


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_generated_table_row_closes_its_code_spans_and_has_the_headers_cells(name):
    """A recipe summary cut inside a code span once swallowed the cells after it (model, epochs, `train.amp`), and
    an option whose default is an empty list showed its default as two backticks."""
    markdown = GENERATORS[name]()
    assert markdown.count("\n|") > 2
    assert not table_faults(markdown), "\n".join(table_faults(markdown))


def test_every_generated_table_cell_renders_without_a_stray_backtick(site):
    for page in ("reference/cli.md", "reference/configuration.md"):
        for table in re.findall(r"<table>(.*?)</table>", (site / built(page)).read_text(), flags=re.S):
            header = len(re.findall(r"<th\b", table))
            for row in re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)[1:]:
                cells = re.findall(r"<td\b[^>]*>(.*?)</td>", row, flags=re.S)
                assert len(cells) == header, f"{page}: {row}"
                stray = [cell for cell in cells if "`" in html.unescape(re.sub(r"<[^>]+>", "", cell))]
                assert not stray, f"{page}: a code span broken open: {stray}"


def test_the_generated_references_show_tokens_such_as_end_instead_of_hiding_them_as_tags(site):
    for page in ("reference/cli.md", "reference/configuration.md"):
        raw = re.sub(r"<code>.*?</code>|<pre>.*?</pre>", "", (site / built(page)).read_text(), flags=re.S)
        assert not re.findall(r"<(?:end|start|pad|unk|decoder)>", raw), f"{page}: a token left as an HTML tag"
    text = page_text(site, "reference/configuration.md")
    assert "no <end> before this many words" in text and "model.<decoder>.*" in text


def test_every_page_has_its_table_of_contents_and_no_raw_tex(site):
    """The results page, the longest, once hid its table of contents; the attention guide once showed ``a_{sₜ}``
    raw (the site renders no TeX: it works offline, so maths is written in Unicode and <sub>)."""
    results = (site / built("results.md")).read_text()
    assert not re.search(r'data-md-type="toc"[^>]*\bhidden', results), "the results page hides its contents"
    for heading in ("the-demo", "how-results-are-produced"):
        assert re.search(rf'<nav class="md-nav md-nav--secondary".*?href="#{heading}"', results, flags=re.S), heading
    for page in sorted((ROOT / "docs").rglob("*.md")):
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))
        assert not re.search(r"[_^]\{|\\(frac|sum|alpha|mathrm)\b|\$\$", prose), f"{page.name}: raw TeX"


def test_the_python_api_reference_is_rendered_from_the_docstrings(site):
    text = page_text(site, "reference/python.md")
    assert "Predictor" in text and "with_decoding" in text and "CaptionResult" in text


@pytest.mark.parametrize("page", UNDATED, ids=lambda page: str(page.relative_to(ROOT)))
def test_the_readme_and_the_guides_name_no_commit_date_or_today(page):
    text = page.read_text()
    for pattern, what in ((COMMIT_HASH, "a commit hash"), (DATE, "a date"), (TODAY, '"today"')):
        found = pattern.search(text)
        assert not found, (f"{page.relative_to(ROOT)} names {what} ({found.group()!r}): measured figures belong in "
                           "benchmarks/results/ and their tables, history in CHANGELOG.md")


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_citation_file_names_this_version():
    assert yaml.safe_load((ROOT / "CITATION.cff").read_text())["version"] == __version__
