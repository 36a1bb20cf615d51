# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test lint unit demo bench images clean

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

setup: $(STAMP)
	@bash scripts/setup.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check interference node_agent scheduler interference_cli tests bench
	$(VENV)/bin/ruff format --check interference node_agent scheduler interference_cli tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: setup lint
	$(PY) -m pytest

demo: setup
	$(PY) -m interference_cli.demo

bench: setup
	$(PY) bench/agent_overhead.py
	$(PY) bench/scheduler_throughput.py

images:
	docker build -f deploy/docker/agent.Dockerfile -t interference-agent:dev .
	docker build -f deploy/docker/scheduler.Dockerfile -t interference-scheduler:dev .

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
