# The two commands of the README's Quick start: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck chromium bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Re-install when the project's metadata changes. The distribution is `lantern-durable`; a
# .venv made before the rename still holds it as `lantern`, which is removed first.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip uninstall --quiet --yes lantern 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip uninstall --quiet --yes lantern 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

demo: $(VENV)/.installed
	$(BIN)/lantern demo

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check lantern tests bench examples
	$(BIN)/ruff format --check lantern tests bench examples
	$(BIN)/lint-imports --no-cache

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy lantern

# The browser tests drive Debian's Chromium through Playwright's client; no browser is downloaded.
# The package lists are refreshed only when the install fails on stale ones.
chromium:
	@command -v chromium >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
		|| (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

test: lint typecheck chromium
	$(BIN)/python tests/pg_server.py ensure
	$(BIN)/pytest -n 2 -q

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/steps.py

clean:
	rm -rf $(VENV) .lantern
