# The two commands of the README. Both bootstrap what they need, idempotently.
#   make demo   the main job on embedded defaults: stream aggregation through a driver crash
#   make test   lint, format check, mypy --strict, the import-layer contracts, and the
#               whole pytest suite (all markers)

VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test bootstrap system-test clean

# (Re)install only when pyproject.toml changed since the last install.
$(STAMP): pyproject.toml scripts/bootstrap.sh
	@bash scripts/bootstrap.sh "$(VENV)"
	@touch "$(STAMP)"

bootstrap: $(STAMP)

demo: $(STAMP)
	@bash scripts/check_system.sh java
	@$(BIN)/riverbed demo

system-test:
	@bash scripts/check_system.sh java etcd postgres chromium s3

test: $(STAMP) system-test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy src
	$(BIN)/lint-imports --no-cache
	$(BIN)/pytest

clean:
	rm -rf $(VENV) .riverbed .pytest_cache .mypy_cache .ruff_cache
