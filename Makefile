# Two commands on a fresh machine: `make demo` and `make test`.
# Both create or reuse .venv, install the pinned stack when requirements change,
# and make sure Java 17 is there for Spark.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.modeswitch-installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: a test file to a worker (xdist hands out the files
# with the most tests first; among equals, tests/conftest.py's longest-first order holds);
# tests marked `exclusive` run alone, unit tests aside (tests/conftest.py). Two, one a core:
# the whole suite passed here in two workers in 24:27 (891 tests, 2026-11-27).
# PYTEST_WORKERS=0 runs everything in this process.
PYTEST_WORKERS ?= 2
# Every run ends with its 40 slowest test phases (--durations), the record of where the time goes.

.PHONY: install java jars kafka-broker schema-registry cds chromium postgres demo test lint format bench soak soak-faults clean \
	compose-images compose-demo compose-down test-compose soak-compose

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if v == (3, 11) else "modeswitch needs Python 3.11 (found %d.%d): set PYTHON=/path/to/python3.11" % v)'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -c 'import pyspark, airflow, deltalake, pyarrow' || { echo "installing the requirements failed" >&2; exit 1; }
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e . 2>&1 | grep -v "^WARNING: Location" || true
	@touch $(STAMP)

install: $(STAMP) java jars kafka-broker schema-registry cds

# The JVM artifacts of jvm/pom.xml (delta-spark and what it needs that pyspark lacks), copied
# into $(JARS) for every Spark session's spark.jars (modeswitch.runners.jvm.fetched_jars).
# Fetched again only when the pom changes; a new folder replaces the old one whole, so no jar
# of an older pom stays behind.
JARS := .jars
JARS_STAMP := $(JARS)/.fetched

jars: $(JARS_STAMP)

$(JARS_STAMP): jvm/pom.xml | java
	@bash tools/ensure-maven.sh
	@rm -rf $(JARS).new
	mvn -B -q -f jvm/pom.xml dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(JARS).new
	@touch $(JARS).new/.fetched
	@rm -rf $(JARS) && mv $(JARS).new $(JARS)

# An Apache Kafka broker's jars (jvm/kafka-broker/pom.xml), apart from Spark's: the kafka tier
# starts a KRaft broker with them (modeswitch.devtools.kafka_broker).
BROKER_JARS := .kafka-broker
BROKER_STAMP := $(BROKER_JARS)/.fetched

kafka-broker: $(BROKER_STAMP)

$(BROKER_STAMP): jvm/kafka-broker/pom.xml | java
	@bash tools/ensure-maven.sh
	@rm -rf $(BROKER_JARS).new
	mvn -B -q -f jvm/kafka-broker/pom.xml dependency:copy-dependencies -DoutputDirectory=$(CURDIR)/$(BROKER_JARS).new
	@touch $(BROKER_JARS).new/.fetched
	@rm -rf $(BROKER_JARS) && mv $(BROKER_JARS).new $(BROKER_JARS)

# A schema registry (Apicurio Registry's Quarkus application, jvm/schema-registry/pom.xml),
# apart from Spark's jars: the registry tests start it on loopback
# (modeswitch.devtools.schema_registry).
REGISTRY_APP := .schema-registry
REGISTRY_STAMP := $(REGISTRY_APP)/.fetched

schema-registry: $(REGISTRY_STAMP)

$(REGISTRY_STAMP): jvm/schema-registry/pom.xml | java
	@bash tools/ensure-maven.sh
	@rm -rf $(REGISTRY_APP).new
	mvn -B -q -f jvm/schema-registry/pom.xml dependency:unpack -DoutputDirectory=$(CURDIR)/$(REGISTRY_APP).new
	@touch $(REGISTRY_APP).new/.fetched
	@rm -rf $(REGISTRY_APP) && mv $(REGISTRY_APP).new $(REGISTRY_APP)

java:
	@bash tools/ensure-java.sh

# A class-data-sharing archive of Spark's JVM classes: every Spark job starts faster with it
# (modeswitch.runners.jvm; made once per Java, Spark version and set of jars, ~1 min; kept in
# ~/.cache/modeswitch).
cds: $(STAMP) java jars
	@$(PY) -m modeswitch.runners.jvm

demo: install
	$(PY) -m modeswitch.devtools.airflow_demo .demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The browser tier's headless chromium and its driver (Debian's packages).
chromium:
	@bash tools/ensure-chromium.sh

# The scheduler tests' PostgreSQL server binaries (Debian's package; the tests run a throwaway
# server on loopback).
postgres:
	@bash tools/ensure-postgres.sh

test: install chromium postgres lint
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40 \
		--ignore=tests/compose $(PYTEST_ARGS)

# Benchmarks have their own command; results and how to read them are in docs/BENCHMARKS.md.
bench: install
	@for script in bench/bench_*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

# Half an hour of the demo's pipeline under a live producer, maintenance every 5 minutes and a
# SIGKILL of the stream job every ~7; audit and memory at the end (bench/soak.py; results in
# docs/BENCHMARKS.md). SOAK_MINUTES sets its length.
SOAK_MINUTES ?= 30
soak: install
	$(PY) bench/soak.py --minutes $(SOAK_MINUTES) --json soak-result.json

# The fault tests of `make test`, for longer. Random SIGKILLs (3 seeds, 5 each, ~5 min; odd
# seeds on the local runner, even ones on the warm engine; one seed on a Kafka topic whose
# broker is SIGKILLed 3 times; one under the real scheduler, whose tasks and jobs are
# SIGKILLed 3 times): SOAK_SEEDS seeds with SOAK_FAULTS faults each (about 1.5-2 minutes a
# seed on 2 cores), SOAK_BROKER_SEEDS on Kafka and SOAK_SCHEDULER_SEEDS under the scheduler.
# The warehouse filling up at SOAK_FULL_SIZES and turning read-only after SOAK_READ_ONLY_WAVES;
# PostgreSQL crashed SOAK_PG_CRASHES times under the stream; SOAK_FUZZ_EXAMPLES hostile
# requests per API fuzz test.
SOAK_SEEDS ?= $(shell seq -s, 100 111)
SOAK_FAULTS ?= 8
SOAK_BROKER_SEEDS ?= $(shell seq -s, 200 205)
SOAK_FLEET_SEEDS ?= $(shell seq -s, 600 603)
SOAK_SCHEDULER_SEEDS ?= $(shell seq -s, 300 303)
SOAK_FULL_SIZES ?= 12m,18m,24m,32m
SOAK_READ_ONLY_WAVES ?= 1,3,6
SOAK_PG_CRASHES ?= 4
SOAK_FUZZ_EXAMPLES ?= 3000
soak-faults: install postgres
	MODESWITCH_FAULT_SEEDS=$(SOAK_SEEDS) MODESWITCH_FAULTS_PER_SEED=$(SOAK_FAULTS) \
		MODESWITCH_BROKER_FAULT_SEEDS=$(SOAK_BROKER_SEEDS) \
		MODESWITCH_FLEET_FAULT_SEEDS=$(SOAK_FLEET_SEEDS) MODESWITCH_FLEET_FAULTS_PER_SEED=$(SOAK_FAULTS) \
		MODESWITCH_SCHEDULER_FAULT_SEEDS=$(SOAK_SCHEDULER_SEEDS) \
		MODESWITCH_SCHEDULER_FAULTS=$(SOAK_FAULTS) \
		MODESWITCH_STORAGE_FULL_SIZES=$(SOAK_FULL_SIZES) \
		MODESWITCH_STORAGE_READ_ONLY_WAVES=$(SOAK_READ_ONLY_WAVES) \
		MODESWITCH_PG_CRASHES=$(SOAK_PG_CRASHES) \
		MODESWITCH_API_FUZZ_EXAMPLES=$(SOAK_FUZZ_EXAMPLES) \
		$(PY) -m pytest -rP tests/faults/test_random_faults.py tests/faults/test_fleet_faults.py \
		tests/airflow/test_scheduler_faults.py tests/faults/test_storage_faults.py \
		"tests/airflow/test_scheduler_run.py::test_on_postgres_the_scheduler_runs_an_epoch_pair_and_a_control_command" \
		tests/airflow/test_web_api.py $(PYTEST_ARGS)

clean:
	rm -rf .demo .demo-fleet .pytest_cache .ruff_cache soak-result.json .compose/data

# --- the compose stack (docker-compose.yaml; docs/DEPLOY.md) ------------------------------
# `make compose-demo` starts dockerd if none answers (Debian's docker.io, installed if
# missing), builds the images (tools/compose/build: a local Debian 12 base, no registry
# needed), starts the stack and runs the demo cycle through its Airflow; SOURCE=kafka runs it
# on a topic of the stack's broker. `make compose-down` stops the stack and a dockerd that
# these targets started; the data (.compose/data) stays until `make clean`.
SOURCE ?= embedded
compose-images: install
	@tools/compose/dockerd up
	@tools/compose/build

compose-demo: compose-images
	$(PY) -m modeswitch.devtools.compose demo --source $(SOURCE)

compose-down:
	@if docker info >/dev/null 2>&1; then $(PY) -m modeswitch.devtools.compose down; fi
	@tools/compose/dockerd down

# The stack's smoke test (one batch -> stream cycle, audit, a request without the engine's
# token refused), run by CI after `make test`; the fault families under soak-compose.
test-compose: compose-images
	$(PY) -m pytest -p no:cacheprovider tests/compose -m "compose and not soak" $(PYTEST_ARGS)

soak-compose: compose-images
	$(PY) -m pytest -p no:cacheprovider -rP tests/compose -m compose $(PYTEST_ARGS)

# --- Airflow -----------------------------------------------------------------------------
# `make demo` runs the pipeline DAG (dag.test, one run per epoch) on a local Airflow under
# .demo/airflow; `make demo-local` is the same cycle without Airflow (modeswitch.devtools.demo).
# `make airflow` starts `airflow standalone` (SQLite under .airflow/) with these DAGs in its
# own process group; Ctrl-C stops the whole group.
.PHONY: demo-local demo-kafka demo-fleet airflow

# Three pipelines of one deployment at once under one Airflow (a settings file each in
# .demo-fleet/pipelines), their epochs in one shared warm engine; each one's log and tables
# under .demo-fleet/<pipeline>/ (modeswitch.devtools.fleet_demo).
demo-fleet: install
	$(PY) -m modeswitch.devtools.fleet_demo .demo-fleet

demo-local: install
	$(VENV)/bin/modeswitch demo --dir .demo

# The same cycle reading a Kafka topic of 16 partitions, in a broker on loopback that the demo
# starts and stops itself (Apache Kafka, one KRaft node: modeswitch.devtools.kafka_broker).
demo-kafka: install
	$(VENV)/bin/modeswitch demo --kafka --buckets 16 --records 600000 --dir .demo-kafka

airflow: install
	$(PY) -m modeswitch.devtools.airflow_local .airflow
