# Two commands matter: `make demo` (the main job on the bundled real data) and `make test` (the whole suite).
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test typecheck lint-imports unit bench bench-serving clean

$(STAMP): pyproject.toml constraints.txt scripts/bootstrap-venv.sh
	scripts/bootstrap-venv.sh $(PYTHON) $(VENV)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/recommender demo

test: $(STAMP)
	$(BIN)/mypy
	$(BIN)/pytest

typecheck: $(STAMP)
	$(BIN)/mypy

lint-imports: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest tests/unit

bench: $(STAMP)
	$(BIN)/python -m bench recommend

bench-serving: $(STAMP)
	$(BIN)/python -m bench serving --requests 3000

clean:
	rm -rf $(VENV) demo-output .pytest_cache .mypy_cache
