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
from docs_reference import commands  # noqa: E402

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


def page_text(site: Path, page: str) -> str:
    """The text of a built page, without its tags."""
    return html.unescape(re.sub(r"<[^>]+>", "", (site / page).read_text()))


def test_the_site_builds_with_every_page_of_the_navigation(site):
    navigation = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(entries):
        for entry in entries:
            for value in entry.values():
                yield from (pages(value) if isinstance(value, list) else [value])

    for page in pages(navigation):
        assert (site / page.replace(".md", ".html")).is_file(), page


def test_the_command_line_reference_lists_every_command_and_option(site):
    text = page_text(site, "reference/cli.html")
    for names, _, parser in commands(build_parser()):
        assert f"captioner {' '.join(names)}" in text
        flags = {flag for action in parser._actions if not isinstance(action, argparse._HelpAction)
                 for flag in action.option_strings}
        section = text.split(f"captioner {' '.join(names)}¶", 1)[1].split("¶", 1)[0]
        missing = [flag for flag in flags if flag not in section]
        assert not missing, f"captioner {' '.join(names)}: {missing} missing from the generated reference"


def test_the_configuration_page_lists_every_shipped_recipe_and_every_setting(site):
    text = page_text(site, "reference/configuration.html")
    assert len(recipes()) >= 13
    missing = [name for name in recipes() if name not in text]
    assert not missing, f"recipes missing from the configuration page: {missing}"
    settings = re.findall(r"^\| `([a-z_.]+)` \|", config_reference(), flags=re.M)
    assert settings and not [setting for setting in settings if setting not in text]


def test_the_python_api_reference_is_rendered_from_the_docstrings(site):
    text = page_text(site, "reference/python.html")
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
