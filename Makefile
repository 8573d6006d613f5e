# The two commands of the README. Both bootstrap what they need, idempotently.
#   make demo   the main job on embedded defaults: stream aggregation through a driver crash
#   make test   lint, format check, mypy --strict, the import-layer contracts, and the
#               whole pytest suite (all markers), in three pytest-xdist workers: the slow
#               Spark scenario tests in two groups, each in turn on a worker of its own,
#               everything else around them (tests/conftest.py, tests/timings.py)
#   make check  the quick loop: the same lint, and the tests that need no server and
#               no Spark (docs/testing.md)

VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test check lint bootstrap system-test compile jars spark-archive clean

# (Re)install only when pyproject.toml changed since the last install.
$(STAMP): pyproject.toml scripts/bootstrap.sh
	@bash scripts/bootstrap.sh "$(VENV)"
	@touch "$(STAMP)"

bootstrap: $(STAMP)

# Byte-compile riverbed's own sources (only what changed). Machines that export
# PYTHONDONTWRITEBYTECODE=1 never cache them otherwise, and every riverbed process the
# demo and the tests start (workers, drivers, CLIs, executors) would compile them again:
# ~0.3 s a process on 2 cores.
compile:
	@$(BIN)/python -m compileall -q src tests >/dev/null

# A class-data archive of Spark's JVM classes (riverbed.spark.cds): every Spark driver
# the demo and the tests start maps them instead of loading them (built once, 2-3 min here);
# and bytecode in PySpark's worker zips (riverbed.spark.bytecode), which every Python
# process Spark starts imports from (a few seconds, once).
spark-archive:
	@$(BIN)/python -m riverbed.spark.bytecode
	@$(BIN)/python -m riverbed.spark.cds

# The JVM jars Spark drivers add to PySpark's own — Hadoop's S3A connector with the AWS
# SDK bundle at PySpark's Hadoop version, Spark's Kafka and Avro connectors — resolved
# from Maven Central by Spark's own Ivy into $(VENV)/jars (`riverbed setup jars`, what a
# pip-installed riverbed runs too: riverbed.spark.jars), and the tests' Kafka broker
# (scripts/jars/kafka-broker.pom.xml, Maven) into $(VENV)/kafka and Iceberg's REST catalog
# server (scripts/jars/iceberg-rest.pom.xml) into $(VENV)/iceberg-rest; once (~830 MB), then a
# no-op.
jars: $(STAMP)
	@$(BIN)/riverbed setup jars
	@bash scripts/fetch_test_servers.sh "$(VENV)"

demo: $(STAMP) compile
	@bash scripts/check_system.sh java
	@$(MAKE) --no-print-directory spark-archive
	@$(BIN)/riverbed demo

system-test:
	@bash scripts/check_system.sh java etcd postgres mariadb chromium s3

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts
	$(BIN)/mypy src
	$(BIN)/lint-imports --no-cache

test: $(STAMP) system-test compile jars spark-archive lint
	$(BIN)/pytest -n 3 --dist loadgroup

# The quick loop while working (docs/testing.md): lint, types, import layers and every
# test that needs no server, no Spark and no multi-process scenario; `make test` runs
# everything and is what CI runs.
QUICK := not (spark or etcd or postgres or mariadb or s3 or kafka or rest_catalog or setup or slow or browser)
check: $(STAMP) compile lint
	RIVERBED_TESTS_QUICK=1 $(BIN)/pytest -n 2 -q -m "$(QUICK)" --durations=10

clean:
	rm -rf $(VENV) .riverbed .pytest_cache .mypy_cache .ruff_cache
	find src tests -name __pycache__ -prune -exec rm -rf {} +
