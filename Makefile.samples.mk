# Included by the Makefile. Regenerates the bundled synthetic traces and their manifest
# (deterministic: seed 0, 4 decode steps; each file under 5 MB).
SAMPLES_DIR ?= sample_traces

## samples: regenerate sample_traces/*.sqlite and sample_traces/manifest.json
samples: $(STAMP)
	$(PY) -m nsys_ledger.synth.samples $(SAMPLES_DIR)
