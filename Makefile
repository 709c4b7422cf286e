# Two commands matter: `make demo` (the main job on the bundled real data) and `make test` (the whole suite).
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test typecheck lint lint-imports unit bench bench-serving docs clean format

$(STAMP): pyproject.toml constraints.txt scripts/bootstrap-venv.sh
	scripts/bootstrap-venv.sh $(PYTHON) $(VENV)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/recommender demo

test: $(STAMP)
	scripts/install-test-deps.sh
	# The end-to-end tests' control plane (built once, cached); exit 3 = no Go here, and those tests say so.
	scripts/build-control-plane.sh >/dev/null || [ $$? -eq 3 ]
	# helm for the chart's tests (built once from the Go module proxy, cached); exit 3 = no Go, and they say so.
	scripts/build-helm.sh >/dev/null || [ $$? -eq 3 ]
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
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
bench-serving: $(STAMP)
	$(BIN)/python -m bench serving --requests 3000

clean:
	rm -rf $(VENV) demo-output .pytest_cache .mypy_cache
