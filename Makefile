# unitscale: `make html` builds the site, `make test` runs everything CI runs.
# Both create .venv and install from constraints.txt on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SPHINX := $(PY) -m sphinx -b html -W --keep-going -j auto . _build/html
CHROMIUM ?= /usr/bin/chromium
export OMP_NUM_THREADS ?= 2
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: html test unit doctest site browser bench serve notebooks clean chromium lint

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip -c constraints.txt
	$(PY) -m pip install -q -c constraints.txt -e '.[docs,test]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

## html: build the site, executing every tutorial (cached: unchanged tutorials are not re-run)
html: $(STAMP)
	$(SPHINX)
	@echo "open _build/html/index.html"

## test: unit, property and error tests, doctests, the site build (every tutorial executed), browser tests
test: $(STAMP) chromium
	$(PY) -m pytest -m "not browser" -p no:cacheprovider tests unitscale --doctest-modules
	NB_EXECUTION_MODE=force $(SPHINX)
	$(PY) -m pytest -m browser -p no:cacheprovider tests

unit: $(STAMP)
	$(PY) -m pytest -m "not browser and not slow" tests

doctest: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider --doctest-modules unitscale

site: $(STAMP)
	NB_EXECUTION_MODE=force $(SPHINX)

browser: $(STAMP) chromium
	$(PY) -m pytest -m browser tests

bench: $(STAMP)
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

serve: $(STAMP)
	$(PY) -m sphinx_autobuild --host 127.0.0.1 --port 8000 --watch unitscale . _build/html

notebooks: $(STAMP)
	mkdir -p notebooks
	$(VENV)/bin/jupytext --to ipynb --output-dir notebooks tutorials/*.md 2>/dev/null || \
	  for f in tutorials/*.md; do $(VENV)/bin/jupytext --to ipynb -o notebooks/$$(basename $${f%.md}).ipynb $$f; done

lint: $(STAMP)
	$(VENV)/bin/ruff check unitscale tests benchmarks
	$(VENV)/bin/mypy

# Debian's Chromium for the browser tests; installed when missing.
chromium:
	@test -x $(CHROMIUM) || { echo "installing chromium"; \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) >/dev/null; }

clean:
	rm -rf _build docs/generated notebooks .pytest_cache .hypothesis
