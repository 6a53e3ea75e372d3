# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXPECT := expectations/glm-5.3-tp8-ep8.toml
SAMPLE := sample_traces/glm5-graph-healthy.sqlite

.PHONY: venv run test samples bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The test target also installs the browser extra (Playwright's Python package) for the HTML
# report's headless-Chromium test; Chromium itself comes from the system (.ci/run installs it).
BROWSER_STAMP := $(VENV)/.installed-browser
$(BROWSER_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,browser]'
	touch $(BROWSER_STAMP)

## run: check the bundled healthy graph-mode sample against the GLM-5.3 ledger
run: $(STAMP)
	$(VENV)/bin/nsys-ledger check $(SAMPLE) --expect $(EXPECT)

## test: the whole test suite
test: $(BROWSER_STAMP)
	$(PY) -m pytest -q

## bench: check against a bare read of the same columns, 100k/1M/5M kernels, graph and eager
## (docs/performance.md; BENCH_ARGS=--quick for 100k only, "--sizes 10M --ranks 8" for the scale figures)
bench: $(STAMP)
	$(PY) bench/bench_check.py $(BENCH_ARGS)

## fuzz: mutated copies of every sample and real trace (SQLite, Kineto JSON, parquetdir) through the whole check (FUZZ_CASES,
## default 10000; FUZZ_ARGS="--first 10000" for new cases, "--case N --keep out/" to rerun one)
FUZZ_CASES ?= 10000
.PHONY: fuzz
fuzz: $(STAMP)
	$(PY) tests/fuzz/fuzz_traces.py --cases $(FUZZ_CASES) --cli-every 100 --keep tests/artifacts/fuzz $(FUZZ_ARGS)

-include Makefile.samples.mk

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
