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

## run: check the bundled healthy graph-mode sample against the GLM-5.3 ledger
run: $(STAMP)
	$(VENV)/bin/nsys-ledger check $(SAMPLE) --expect $(EXPECT)

## test: the whole test suite
test: $(STAMP)
	$(PY) -m pytest -q

## bench: 1M-kernel benchmark, check against a bare read of the same columns
bench: $(STAMP)
	$(PY) bench/bench_check.py

-include Makefile.samples.mk

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
