# Every target builds (once) the cached environment with tools/setup-env, from the committed
# lock (uv.lock), then runs in it. The project itself is used from this checkout (PYTHONPATH),
# tests on XLA:CPU.
SHELL := /bin/bash
ENV = $(shell tools/setup-env)
PY = $(ENV)/bin/python
RUN = PYTHONPATH=$(CURDIR) PJRT_DEVICE=CPU $(PY)
# Colab's notebook stack (IPython 7.34, ipykernel 6.17, ipywidgets 7.7.1: the lock's `colab`
# group), layered over the same torch install.
COLAB = PYTHONPATH=$(ENV)/colab-stack:$(CURDIR) PJRT_DEVICE=CPU TPU_NB_STACK=colab $(PY)
# Every test target runs with temporary folders of its own, new and empty, removed afterwards:
# a test that needs a folder creates it, and nothing an earlier run left (Ray's files, IPython's
# profile, matplotlib's cache, kernels' connection files) can make a test pass here that fails
# on a new machine.
# (Open to others as /tmp is, less the sticky bit: tests of a second user's view enter it.)
# The library's tests compile on XLA:CPU without LLVM's optimisation passes: the same graphs,
# compiled several times faster (a ResNet-18 training step: 19 s to 5 s). The tests compare
# runs made alike, never stored figures, so what they check does not change; every process
# they start gets the same flags (tests/_env.py). The notebooks (nbval) and the demo keep
# XLA's defaults: their stored outputs are what a user's run prints.
TEST_XLA = XLA_FLAGS=--xla_backend_optimization_level=0
FRESH = tmp=$$(mktemp -d) && chmod 755 "$$tmp" && trap 'rm -rf "$$tmp"' EXIT && \
    export TMPDIR="$$tmp" \
    RAY_TMPDIR="$$tmp" IPYTHONDIR="$$tmp/ipython" MPLCONFIGDIR="$$tmp/matplotlib" \
    JUPYTER_RUNTIME_DIR="$$tmp/jupyter-runtime" HF_HOME="$$tmp/huggingface" &&

.PHONY: demo test test-lane-1 test-lane-2 test-current test-current-1 test-current-2 test-colab \
    test-notebooks test-browser bench env doctor lint sync-notebooks

## The main job: run notebooks/00_getting_started.ipynb headless on XLA:CPU, print its
## per-cell XLA report.
demo:
	$(RUN) tools/run_notebook.py notebooks/00_getting_started.ipynb

## The whole test suite: the library and extension on the current notebook stack, the
## extension again on Colab's stack, every notebook with nbval, then the views in a real
## browser. The first three run in two lanes side by side, one per core (a pytest process
## keeps about one core busy); each lane's output is printed when the lane ends. Ray's fake
## slices all start in lane 1. The browser tests run after both lanes, alone: the dashboard's
## timings are real, and a loaded machine is not what they check. The environment is set up
## once, before the lanes start (ENV=... passed down).
test:
	@echo "make test: two lanes side by side; each lane's output is printed when it ends"
	@$(MAKE) --no-print-directory -j2 --output-sync=recurse ENV=$(ENV) test-lane-1 test-lane-2
	@$(MAKE) --no-print-directory ENV=$(ENV) test-browser

test-lane-1:
	@$(MAKE) --no-print-directory -j1 -k test-current-1 test-colab
test-lane-2:
	@$(MAKE) --no-print-directory -j1 -k test-current-2 test-notebooks

# The library's tests, in two parts of about the same length: the files named here, and
# every other (a new test file joins part 2).
CURRENT_1 = tests/test_pod.py tests/test_pod_start.py tests/test_real_models.py tests/test_kernel.py \
    tests/test_cost.py tests/test_interrupts.py tests/test_launch_cleanup.py

test-current: test-current-1 test-current-2

test-current-1:
	$(FRESH) $(TEST_XLA) $(RUN) -m pytest $(CURRENT_1) -q --durations=10

test-current-2:
	$(FRESH) $(TEST_XLA) $(RUN) -m pytest tests -q --ignore=tests/browser $(CURRENT_1:%=--ignore=%) \
	    --durations=10

test-colab:
	$(FRESH) $(TEST_XLA) $(COLAB) -m pytest tests -q -m stack --ignore=tests/browser --durations=10

test-notebooks:
	$(FRESH) $(RUN) -m pytest -q --nbval notebooks --nbval-sanitize-with tools/nbval-sanitize.cfg -p no:randomly

## The live dashboard and the views in a real browser: JupyterLab headless on localhost,
## driven through Debian's chromium + chromium-driver (tools/setup-browser installs them with
## apt-get when they are missing). Screenshots: tests/artifacts/.
test-browser:
	tools/setup-browser
	$(FRESH) TPU_NB_REQUIRE_BROWSER=1 $(TEST_XLA) $(RUN) -m pytest tests/browser -q -rs

bench:
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(RUN) $$b || exit 1; done

doctor:
	$(RUN) -m tpu_nb doctor

## ruff (lint and format) and mypy, the locked versions with pyproject.toml's settings (also
## pre-commit hooks: .pre-commit-config.yaml). All run; the target fails if any finds something.
lint:
	@status=0; $(ENV)/bin/ruff check . || status=1; \
	$(ENV)/bin/ruff format --check . || status=1; $(ENV)/bin/mypy || status=1; exit $$status

## After editing a tutorial's source (notebooks/NN_name.md, jupytext MyST): update the paired
## notebooks' cells, keeping their outputs; then record the outputs (README, Tutorials).
sync-notebooks:
	$(ENV)/bin/jupytext --to ipynb --update notebooks/*.md

env:
	@echo $(ENV)
