# unitscale: `make html` builds the site, `make test` runs everything CI runs.
# Both create .venv and install from constraints.txt on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# -W: a Sphinx warning is an error; --keep-going: report all of them, then fail;
# -T: a failing tutorial cell prints its cell and traceback (not only a path to a log file).
SPHINXOPTS ?= -j auto
SPHINX := $(PY) -m sphinx -b html -W --keep-going -T $(SPHINXOPTS) . _build/html -d _build/doctrees
CHROMIUM ?= /usr/bin/chromium
export OMP_NUM_THREADS ?= 2
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# torch's CPU build: PyPI's Linux torch is the CUDA build (about 5.6 GB). An extra index, and for torch
# alone (--no-deps): where it cannot be reached, pip warns and takes the pinned torch from the indexes it has.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
step = @printf '\n\033[1m== make test, step %s\033[0m\n' "$(1)"

.PHONY: html test unit doctest site browser bench serve notebooks clean chromium lint dist wheelhouse format-tutorials vision

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip -c constraints.txt
	$(PY) -m pip install -q -c constraints.txt --no-deps torch \
		--extra-index-url $(TORCH_INDEX)
	$(PY) -m pip install -q -c constraints.txt -e '.[docs,test]'
	$(MAKE) --no-print-directory vision
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(MAKE) --no-print-directory wheelhouse
	touch $(STAMP)

## vision: timm and torchvision for the tests of unit_scale on CNNs, into .venv/vision (tests/vision_models.py
## puts it on sys.path with a stub for torchvision's C-extension registrations). Not in site-packages: there
## transformers would import torchvision, whose CUDA-built extension fails beside the CPU torch, and every
## transformers model would fail to import. --no-deps: nothing else (torch above all) is installed or changed.
vision:
	$(PY) -m pip install -q -c constraints.txt --no-deps --upgrade --target $(VENV)/vision timm torchvision

## wheelhouse: the wheels a reader's environment needs (the package's dependencies and its
## `tutorials` extra: a kernel, transformers, ipywidgets), fetched once at set-up, so the test that
## installs the site's wheel into a fresh environment and runs every tutorial's download there
## works offline
wheelhouse:
	$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
		print(*p["dependencies"], *p["optional-dependencies"]["tutorials"], sep="\n")' \
		> $(VENV)/reader-requirements.txt
	$(PY) -m pip download -q -c constraints.txt -d $(VENV)/wheelhouse --no-deps --extra-index-url $(TORCH_INDEX) torch
	$(PY) -m pip download -q -c constraints.txt -d $(VENV)/wheelhouse --find-links $(VENV)/wheelhouse \
		-r $(VENV)/reader-requirements.txt

## html: build the site, executing the tutorials through jupyter-cache (an unchanged tutorial is not re-run)
html: $(STAMP)
	NB_EXECUTION_MODE=cache $(SPHINX)
	@echo "open _build/html/index.html"

## test: what CI runs. Any failing step fails it:
##   0. lint: ruff (rules and formatting) over the package, tests, benchmarks and docs/_ext, mypy
##      over the first three, and the tutorials' code cells formatted to 88 columns;
##   1. unit, property and error tests, the site meta-tests (a broken cell, a Sphinx warning and a
##      failing doctest each fail), and every docstring example (--doctest-modules);
##   2. the site, rebuilt from scratch (-E) with every notebook executed (force);
##   3. the built site: every internal link and anchor resolves, and the browser tests
##      (Chromium against every page: layout, figures, contrast, search, downloads).
test: $(STAMP) chromium
	$(call step,0/3: lint (ruff and mypy; the tutorials' cells formatted))
	$(VENV)/bin/ruff check unitscale tests benchmarks docs/_ext
	$(VENV)/bin/ruff format --check unitscale tests benchmarks docs/_ext
	$(VENV)/bin/mypy
	$(PY) docs/_ext/format_tutorials.py --check tutorials/*.md
	$(call step,1/3: tests and doctests)
	$(PY) -m pytest -m "not browser and not built" -p no:cacheprovider -n 2 --doctest-modules tests unitscale
	$(call step,2/3: site build from scratch with every notebook executed)
	NB_EXECUTION_MODE=force $(SPHINX) -E
	$(call step,3/3: links and browser tests)
	$(PY) -m pytest -m "browser or built" -p no:cacheprovider -n 2 tests

unit: $(STAMP)
	$(PY) -m pytest -m "not browser and not built and not slow" tests

doctest: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider --doctest-modules unitscale

site: $(STAMP)
	NB_EXECUTION_MODE=force $(SPHINX) -E

browser: $(STAMP) chromium
	$(PY) -m pytest -m "browser or built" tests

## format-tutorials: ruff-format every tutorial's code cells at 88 columns (the site's code column),
## leaving the prose and the cells' options as they are; running it twice changes nothing
format-tutorials: $(STAMP)
	$(PY) docs/_ext/format_tutorials.py tutorials/*.md

## bench: every benchmark at full settings, one after the other, into one recording at this commit:
## docs/benchmark_runs/recording.json, which the Benchmarks and planner pages show (the site build
## does not re-time them; tests/test_benchmarks.py fails when the library changed after it)
bench: $(STAMP)
	$(PY) benchmarks/record.py

serve: $(STAMP)
	$(PY) -m sphinx_autobuild --host 127.0.0.1 --port 8000 --watch unitscale . _build/html -d _build/doctrees

## notebooks: every tutorial as notebooks/NN_name.ipynb: the site's .ipynb downloads (executed,
## with their outputs and MyST roles rendered as text), copied from the build
notebooks: html
	@mkdir -p notebooks
	@cp _build/html/_sources/tutorials/*.ipynb notebooks/
	@ls notebooks/*.ipynb

## dist: a wheel and an sdist in dist/, built by the venv's own setuptools (no isolated env: works offline),
## then checked by `twine check --strict`
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .
	$(PY) -m twine check --strict dist/*  # metadata and README as PyPI renders them; offline
	@ls dist

lint: $(STAMP)
	$(VENV)/bin/ruff check unitscale tests benchmarks docs/_ext
	$(VENV)/bin/ruff format --check unitscale tests benchmarks docs/_ext
	$(VENV)/bin/mypy
	$(PY) docs/_ext/format_tutorials.py --check tutorials/*.md

# Debian's Chromium for the browser tests; installed when missing.
chromium:
	@test -x $(CHROMIUM) || { echo "installing chromium"; \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) >/dev/null; }

clean:
	rm -rf _build docs/generated notebooks dist build .pytest_cache .hypothesis
