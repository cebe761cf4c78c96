# The two commands of the README's Quick start: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck typescript node chromium runtime-packages bench clean

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
	$(BIN)/mypy lantern tests bench

# The TypeScript client (clients/typescript, docs/typescript.md): built with its pinned
# devDependencies (npm ci, again only when its lock file changes), then tested with Node's own
# runner against a real `lantern serve` of this clone.
TS := clients/typescript
node:
	@command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm \
		|| (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm)

$(TS)/node_modules/.installed: $(TS)/package.json $(TS)/package-lock.json
	$(MAKE) --no-print-directory node
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

typescript: $(VENV)/.installed-dev $(TS)/node_modules/.installed
	cd $(TS) && npm run --silent build
	cd $(TS) && LANTERN_BIN=$(abspath $(BIN)/lantern) npm test --silent

# The browser tests drive Debian's Chromium through Playwright's client; no browser is downloaded.
# The package lists are refreshed only when the install fails on stale ones.
chromium:
	@command -v chromium >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
		|| (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

# The microVM tier's drivers (docs/runtime.md): bubblewrap, gVisor's runsc, QEMU and the kernel
# and busybox the qemu driver's image is built from. All from Debian; nothing downloaded at run time.
RUNTIME_PACKAGES := bubblewrap libseccomp2 runsc qemu-system-x86 linux-image-cloud-amd64 busybox-static lz4
runtime-packages:
	@command -v bwrap >/dev/null && command -v runsc >/dev/null && command -v qemu-system-x86_64 >/dev/null \
		&& ls /boot/vmlinuz-*-cloud-amd64 >/dev/null 2>&1 && dpkg -s busybox-static libseccomp2 >/dev/null 2>&1 && command -v lz4 >/dev/null \
		|| DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(RUNTIME_PACKAGES) \
		|| (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(RUNTIME_PACKAGES))

test: lint typecheck typescript chromium runtime-packages
	$(BIN)/python tests/pg_server.py ensure
	$(BIN)/pytest -n 2 -q --durations=30

bench: $(VENV)/.installed-dev
	$(BIN)/python bench/steps.py

clean:
	rm -rf $(VENV) .lantern
