# tensorplay_edu: `make demo` and `make test` work on a fresh machine (they build .venv first).
PY    := .venv/bin/python
STAMP := .venv/.installed

.PHONY: setup test demo bench gpu-check lab notebooks pictures clean

setup: $(STAMP)

# Re-installs only when the requirements or the package metadata change.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -qq --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -qq --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

NBVAL := --nbval --nbval-current-env --nbval-cell-timeout=120 --nbval-sanitize-with notebooks/sanitize.cfg

# The whole suite: pytest, then every notebook under nbval (stored outputs compared).
test: setup
	$(PY) -m pytest -q tests
	@if ls notebooks/*.ipynb >/dev/null 2>&1; then $(PY) -m pytest -q $(NBVAL) notebooks; fi

# Re-execute every notebook in place (outputs and pictures are committed).
notebooks: setup
	for nb in notebooks/*.ipynb; do \
		$(PY) -m jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=120 "$$nb" || exit 1; \
	done

# The README's pictures, drawn from the code (docs/pictures.py).
pictures: setup
	$(PY) docs/pictures.py

# The main job: a multi-rank run checked against single-process math (CPU, gloo).
demo: setup
	$(PY) -m tensorplay_edu.lab.demo

# Step time, collectives and memory: one process vs tensorplay_edu vs PyTorch's TP (writes benchmarks/results.md).
bench: setup
	$(PY) benchmarks/bench.py $(BENCH_FLAGS)

# The first command on a machine with GPUs (benchmarks/gpu_check.sh): on its GPUs under torchrun, NCCL and CUDA
# required, the demo, transition table and host syncs (PASS / FAIL); a GPU-sized model's tokens/s, MFU and memory
# for ours, float8, async TP, PyTorch's TP and the hand-written floor (MEASURED); losses of ours vs PyTorch, float8
# TP vs one GPU, async vs sync within stated tolerances (PASS / FAIL). No GPU: every line SKIP, exit 0.
gpu-check: setup
	bash benchmarks/gpu_check.sh

# JupyterLab on notebooks/ (or LAB_DIR); extra flags through LAB_FLAGS (e.g. LAB_FLAGS="--no-browser --port=8899").
# Jupyter refuses to start as root (containers) without --allow-root, so root gets it. The settings file spares
# the learner JupyterLab's "get notified about news?" pop-up and its update check.
LAB_FLAGS ?=
LAB_DIR ?= notebooks/
LAB_SETTINGS := .venv/share/jupyter/lab/settings/overrides.d/tensorplay_edu.json
$(LAB_SETTINGS): $(STAMP)
	mkdir -p $(dir $@)
	echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $@

lab: setup $(LAB_SETTINGS)
	.venv/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_FLAGS) $(LAB_DIR)

clean:
	rm -rf .venv build *.egg-info tensorplay_edu.egg-info .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
