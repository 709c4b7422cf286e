# Two commands matter: `make demo` (the main job on the bundled real data) and `make test` (the whole suite).
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test typecheck lint lint-imports unit bench bench-serving docs docs-site docs-images clean format

# Quiet: one line per set-up step (the script logs the rest to $(VENV)/bootstrap.log), then only the demo's own output.
$(STAMP): pyproject.toml constraints.txt scripts/bootstrap-venv.sh
	@scripts/bootstrap-venv.sh $(PYTHON) $(VENV)
	@touch $(STAMP)

demo: $(STAMP)
	@$(BIN)/recommender demo

test: $(STAMP)
	scripts/install-test-deps.sh
	# The end-to-end tests' control plane (built once, cached); exit 3 = no Go here, and those tests say so.
	scripts/build-control-plane.sh >/dev/null || [ $$? -eq 3 ]
	# helm for the chart's tests (built once from the Go module proxy, cached); exit 3 = no Go, and they say so.
	scripts/build-helm.sh >/dev/null || [ $$? -eq 3 ]
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	# The user guide: a broken link or anchor fails here (the log is printed only then).
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict >$(VENV)/mkdocs.log 2>&1 || { cat $(VENV)/mkdocs.log; exit 1; }
	$(BIN)/pytest

typecheck: $(STAMP)
	$(BIN)/mypy

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

lint-imports: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest tests/unit

bench: $(STAMP)
	$(BIN)/python -m bench recommend

docs: $(STAMP)
	$(BIN)/python -c "from cli.settings import markdown_reference; open('docs/configuration.md', 'w').write(markdown_reference())"

# The product pictures in docs/images/ (four-lines.png, dashboard.png), re-made from the demo and headless Chromium.
docs-images: $(STAMP)
	scripts/install-test-deps.sh
	$(BIN)/python scripts/docs_images.py

# The user guide as a site in site/ (open site/index.html), checked as `make test` checks it.
docs-site: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
bench-serving: $(STAMP)
	$(BIN)/python -m bench serving --requests 3000

clean:
	rm -rf $(VENV) demo-output site .pytest_cache .mypy_cache
