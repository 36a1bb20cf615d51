# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test lint unit demo demo-cluster bench images base-image local-images e2e-cluster config-reference clean

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

setup: $(STAMP)
	@bash scripts/setup.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check interference interference_infra node_agent scheduler interference_cli interference_demo credential_issuer tests bench
	$(VENV)/bin/ruff format --check interference interference_infra node_agent scheduler interference_cli interference_demo credential_issuer tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Most tests wait on real processes (an apiserver, Redis, Prometheus, a browser), so two
# workers share the machine (each its own control plane and Redis; a file's tests stay on
# one worker for its fixtures); then the tests that measure the kernel run alone
# (marker `alone`: bpf and the agent's). The slowest of each part close its report.
test: setup lint
	$(PY) -m pytest -n 2 --dist loadfile -m "not alone" --durations=15
	$(PY) -m pytest -m alone --durations=10

# Minutes, not half an hour: no BPF, no real Redis or apiserver, no slow tests, no manifest renders.
unit: $(STAMP)
	$(PY) -m pytest -n 2 -m "not bpf and not e2e and not slow and not redis" --ignore=tests/deploy

demo: setup
	$(PY) -m interference_demo.demo

# Every benchmark behind docs/BENCHMARKS.md's headline table, with the arguments of its
# figures (bench/run.sh); `make bench BENCH=name` runs one. One needing root or a real
# kube-apiserver it cannot have here prints a "skip" line. Over an hour in all.
# `make bench BENCH=throughput_versus BASE=REV`: this tree beside a revision, in turns.
BENCHES := agent_overhead agent_metrics_scrape runqlat_accuracy demo onoff_antagonist \
	rebalance scheduler_throughput tracing_cost signal_plane scheduler_real_api \
	preemption_real_api extender_real_api extender_costly_requests noisy_node
BENCH ?= $(BENCHES)

bench: setup
	@failed=""; for name in $(BENCH); do \
		PY=$(PY) BASE=$(BASE) bash bench/run.sh $$name || failed="$$failed $$name"; \
	done; \
	if [ -n "$$failed" ]; then echo "bench: missed a target or failed:$$failed"; exit 1; fi

# interference-{agent,scheduler}:<pyproject version>, the tags deploy/base deploys.
# Variables (BASE_IMAGE, PIP_INDEX_URL, PIP_CA, PIP_CONF, ...): scripts/build-images.sh.
images:
	bash scripts/build-images.sh

# Without a registry: a debootstrap base, then every image the local-images overlay runs.
base-image:
	bash scripts/build-base-image.sh interference-base:bookworm

local-images: base-image
	IMAGES="agent scheduler redis pause" BASE_IMAGE=interference-base:bookworm bash scripts/build-images.sh

# A real cluster of two nodes on this machine, the install of docs/operations.md, checks,
# the demo's two acts, uninstall, and a leak check (root; skipped with a reason when it
# cannot run here).
e2e-cluster: setup
	bash tests/cluster/e2e_cluster.sh

# The demo's two acts on that real cluster of two nodes (root; about 10 minutes, most of it
# the image builds): the install and the acts, without the other checks of e2e-cluster.
demo-cluster: setup
	E2E_CHECKS=demo bash tests/cluster/e2e_cluster.sh

# docs/configuration.md from the settings dataclasses (tests/scheduler/test_config_reference.py).
config-reference: $(STAMP)
	$(PY) -c 'from scheduler.entry.config import reference; print(reference(), end="")' > docs/configuration.md

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
