"""The environment variables the package reads: each declared once, in :data:`ENVIRONMENT`, with
its name, its default, its parser and its doc, and read only through :func:`env_value` (or, to
hand a value on to another process exactly as it was set, :func:`env_text`).

The settings (:mod:`modeswitch.control.settings`) are what an operator tunes per pipeline; these
are what a process needs before it has any settings: where the jars and caches are, the Spark
master outside Airflow, the credentials that must never be settings, the schedules of the DAGs
read while their files are parsed, and the dev tools' and tests' switches. An unset or blank
variable reads as its default; a value its parser refuses raises
:class:`~modeswitch.errors.ConfigError` naming the variable and the value (never the value of a
secret one). :func:`environment_table` makes the table of docs/AIRFLOW.md from the declarations,
beside the settings table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from modeswitch.errors import ConfigError

T = TypeVar("T")

PREFIX = "MODESWITCH_"
"""What every variable's name starts with (and what Spark's redaction hides: a session's
``spark.executorEnv.MODESWITCH_*`` entries)."""
REPOSITORY = Path(__file__).resolve().parents[2]
"""The repository's top (an editable install): where ``make install`` fetches jars to."""


# --- parsers: ``parse(raw, *, variable=name)``, raw never blank ------------------------------


def parse_text(raw: str, *, variable: str) -> str:
    """The text, trimmed."""
    return raw.strip()


def parse_path(raw: str, *, variable: str) -> Path:
    """A path as given (relative ones to the working folder of whoever opens it)."""
    return Path(raw)


def parse_resolved_path(raw: str, *, variable: str) -> Path:
    """A path made absolute, links resolved, when read."""
    return Path(raw).resolve()


_OFF_WORDS = frozenset({"off", "0", "false", "no"})


def parse_unless_off(raw: str, *, variable: str) -> bool:
    """False for ``off``, ``0``, ``false`` or ``no`` (any case), True for anything else."""
    return raw.strip().lower() not in _OFF_WORDS


def parse_positive_int(raw: str, *, variable: str) -> int:
    """A whole number > 0, such as ``"2"`` or ``"1_000"``."""
    try:
        number = int(raw.strip(), 10)
    except ValueError:
        raise ConfigError(f"{variable}: {raw!r} is not a whole number", setting=variable) from None
    if number <= 0:
        raise ConfigError(f"{variable}: {raw!r} must be greater than 0", setting=variable)
    return number


def json_object(what: str) -> Callable[..., dict[str, str]]:
    """A parser of a JSON object of strings (``what`` it maps, for its error), values made
    text: how credentials reach a process. Its errors never repeat the value (it may hold
    secrets)."""

    def parse(raw: str, *, variable: str) -> dict[str, str]:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise ConfigError(
                f"environment variable {variable}: not valid JSON (value not shown: it may hold "
                "secrets)",
                setting=variable,
            ) from None
        if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
            raise ConfigError(
                f"environment variable {variable}: expected a JSON object of {what}",
                setting=variable,
            )
        return {key: str(item) for key, item in value.items()}

    return parse


FaultPoints = dict[str, tuple[float, int | None]]
"""Fault points by name: the seconds to pause, and the one call (counted from 1) that pauses,
or None for every call (:mod:`modeswitch.faults`)."""


ENGINE_SHARINGS = ("pipeline", "deployment")


def parse_engine_sharing(raw: str, *, variable: str) -> str:
    """``pipeline`` or ``deployment``."""
    value = raw.strip().lower()
    if value not in ENGINE_SHARINGS:
        raise ConfigError(f"{variable}: {raw!r} is not one of {', '.join(ENGINE_SHARINGS)}")
    return value


def parse_fault_points(raw: str, *, variable: str) -> FaultPoints:
    """``name=seconds[@hit][,...]`` as :data:`FaultPoints`."""
    points: FaultPoints = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, timing = item.partition("=")
        seconds, _, hit = timing.partition("@")
        try:
            points[name.strip()] = (float(seconds or 0), int(hit) if hit else None)
        except ValueError:
            raise ConfigError(
                f"{variable}: {item!r} is not name=seconds[@hit] (in {raw!r})", setting=variable
            ) from None
    return points


# --- the declarations ------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvironmentVariable(Generic[T]):
    """One environment variable: its row of :data:`ENVIRONMENT`.

    ``parse(raw, *, variable=name)`` reads a set, non-blank value (a ConfigError naming the
    variable and the value when it is not one); ``default`` is the value when the variable is
    unset or blank, or ``default_factory()`` where it depends on the machine (the home folder),
    and ``shown`` is the default as the docs show it (markdown; required with a factory).
    ``secret``: the value holds credentials; errors never repeat it."""

    name: str
    parse: Callable[..., T]
    doc: str
    default: T | None = None
    default_factory: Callable[[], T] | None = None
    shown: str | None = None
    secret: bool = False

    def __post_init__(self) -> None:
        if not self.name.startswith(PREFIX):
            raise ValueError(f"environment variable {self.name!r} does not start with {PREFIX}")
        if self.default_factory is not None and self.shown is None:
            raise ValueError(f"environment variable {self.name}: a default_factory needs shown")

    def describe_default(self) -> str:
        """The default as the docs' table shows it (markdown)."""
        if self.shown is not None:
            return self.shown
        if self.default is None:
            return "(none)"
        if isinstance(self.default, bool):
            return "`on`" if self.default else "`off`"
        return f"`{self.default}`"


SPARK_MASTER = EnvironmentVariable(
    "MODESWITCH_SPARK_MASTER",
    parse_text,
    "the Spark master of a session the package starts itself where none is given (unset: "
    "`local[*]`); under `spark-submit` its `--master` wins",
)
JARS = EnvironmentVariable(
    "MODESWITCH_JARS",
    parse_resolved_path,
    "the folder of the jars every Spark session adds to Spark's own (delta-spark and what it "
    "needs), which `make install` fetches from `jvm/pom.xml`",
    default=REPOSITORY / ".jars",
    shown="`.jars/` at the repository's top",
)
CACHE = EnvironmentVariable(
    "MODESWITCH_CACHE",
    parse_path,
    "the folder of files made once per machine: the Spark driver's class-data-sharing archive, "
    "the Python workers' interpreter, compiled Protobuf schemas",
    default_factory=lambda: Path.home() / ".cache" / "modeswitch",
    shown="`~/.cache/modeswitch`",
)
CDS = EnvironmentVariable(
    "MODESWITCH_CDS",
    parse_unless_off,
    "`off` (or `0`, `false`, `no`): Spark's driver JVM starts without the class-data-sharing "
    "archive (slower), and `make install` makes none",
    default=True,
)
WORKERS_LIKE_HERE = EnvironmentVariable(
    "MODESWITCH_WORKERS_LIKE_HERE",
    parse_unless_off,
    "`on`: the Spark cluster's executors run this same installation at the same paths (the "
    "compose stack: one image for every container), so their Python workers start through "
    "the launcher in `MODESWITCH_CACHE`, as on a local master; the image makes the launcher "
    "when it is built",
    default=False,
)
ENGINE_DIR = EnvironmentVariable(
    "MODESWITCH_ENGINE_DIR",
    parse_path,
    "the folder of the warm engines' address files (one per pipeline and state root), where an "
    "epoch task finds its pipeline's engine",
    default_factory=lambda: Path.home() / ".cache" / "modeswitch" / "engines",
    shown="`~/.cache/modeswitch/engines`",
)


def parse_host_port(raw: str, *, variable: str) -> tuple[str, int]:
    """``HOST:PORT``, such as ``engine:7788``: the host and the port (1-65535)."""
    host, _, port = raw.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{variable}: {raw!r} is not HOST:PORT", setting=variable)
    return host, int(port)


ENGINE_SHARING = EnvironmentVariable(
    "MODESWITCH_ENGINE_SHARING",
    parse_engine_sharing,
    "warm engines (`engine = warm`): `pipeline`, an engine for each pipeline; `deployment`, one "
    "engine for every pipeline of the deployment (sharing their credentials), each pipeline's "
    "epochs in a lane of their own and its Spark jobs in a scheduler pool of their own "
    "([AIRFLOW.md](AIRFLOW.md#one-engine-or-one-each)); the deployment's served engine "
    "(`MODESWITCH_ENGINE_ADDRESS`) always serves them all",
    default="pipeline",
)
ENGINE_ADDRESS = EnvironmentVariable(
    "MODESWITCH_ENGINE_ADDRESS",
    parse_host_port,
    "`HOST:PORT` of the deployment's served engine (the compose stack's `engine` service): "
    "where the engine is chosen, the epoch tasks and the triggerer reach it there, with "
    "`MODESWITCH_ENGINE_TOKEN`, instead of starting one; on the engine itself, where it "
    "listens (`jobs/engine.py --listen`)",
)
ENGINE_TOKEN = EnvironmentVariable(
    "MODESWITCH_ENGINE_TOKEN",
    parse_text,
    "the secret a served engine's clients present; an engine that listens on "
    "`MODESWITCH_ENGINE_ADDRESS` refuses to start without it and refuses a request without it",
    secret=True,
)


STORAGE_OPTIONS = EnvironmentVariable(
    "MODESWITCH_STORAGE_OPTIONS",
    json_object("option names to values"),
    "secret: a JSON object of the tables' storage options (deltalake / object store, e.g. "
    '`{"AWS_REGION": "eu-west-1", ...}`) for the sink, the quarantine and the control tables; '
    "under Airflow the tasks set it from `storage_connection`'s extras",
    default_factory=dict,
    shown="(none)",
    secret=True,
)
KAFKA_CONFIG = EnvironmentVariable(
    "MODESWITCH_KAFKA_CONFIG",
    json_object('librdkafka settings, e.g. {"bootstrap.servers": "broker:9092"}'),
    "secret: a JSON object of a `kafka://` source's client configuration (librdkafka "
    'settings, e.g. `{"bootstrap.servers": "broker:9092"}`); under Airflow the tasks set it '
    "from `kafka_connection`'s extras ([KAFKA.md](KAFKA.md))",
    default_factory=dict,
    shown="(none)",
    secret=True,
)
ALERTS_SCHEDULE = EnvironmentVariable(
    "MODESWITCH_ALERTS_SCHEDULE",
    parse_text,
    "the `modeswitch_lag_alerts` DAG's schedule, read when its file is parsed: a duration "
    "(`30s`), a cron expression or preset, or `none`",
    default="1m",
)
PIPELINE_RETRY_DELAY = EnvironmentVariable(
    "MODESWITCH_PIPELINE_RETRY_DELAY",
    parse_text,
    "how long Airflow waits before it retries a failed try of a pipeline DAG's task (decide, "
    "the epoch's job, close; each has 2 retries), read when its file is parsed: a duration "
    "(`10s`, `2m`)",
    default="30s",
)
BACKFILL_SCHEDULE = EnvironmentVariable(
    "MODESWITCH_BACKFILL_SCHEDULE",
    parse_text,
    "the `modeswitch_backfill` DAG's schedule, read when its file is parsed: a preset or a cron "
    "expression (in UTC) whose runs have data intervals, the windows they backfill",
    default="@daily",
)
BACKFILL_MAX_ACTIVE_RUNS = EnvironmentVariable(
    "MODESWITCH_BACKFILL_MAX_ACTIVE_RUNS",
    parse_positive_int,
    "the `modeswitch_backfill` DAG's `max_active_runs`, read when its file is parsed",
    default=2,
)
MAINTENANCE_SCHEDULE = EnvironmentVariable(
    "MODESWITCH_MAINTENANCE_SCHEDULE",
    parse_text,
    "the `modeswitch_maintenance` DAG's schedule, read when its file is parsed: a preset or a "
    "cron expression, or `none` (runs only when triggered)",
    default="@hourly",
)
PIPELINES_DIR = EnvironmentVariable(
    "MODESWITCH_PIPELINES_DIR",
    parse_resolved_path,
    "the deployment's pipelines folder: one settings file per pipeline (`orders.toml` declares "
    "the pipeline `orders` and its DAGs `orders_pipeline`, ...), read when the DAG files are "
    "parsed and when a task resolves its settings ([AIRFLOW.md](AIRFLOW.md#many-pipelines))",
    default=None,
    shown="`pipelines/` beside the DAG files",
)
SCHEMA_REGISTRY_CONFIG = EnvironmentVariable(
    "MODESWITCH_SCHEMA_REGISTRY_CONFIG",
    json_object('schema registry client settings, e.g. {"url": "http://registry:8080"}'),
    "secret: a JSON object of the schema registry's client configuration for Avro payloads "
    "framed by a registry (Confluent's client settings: `url`, `basic.auth.user.info`, ...; "
    'e.g. `{"url": "http://registry:8081"}`); under Airflow the tasks set it from '
    "`schema_registry_connection` ([KAFKA.md](KAFKA.md#your-topic))",
    default_factory=dict,
    shown="(none)",
    secret=True,
)
SCHEMA_REGISTRY_APP = EnvironmentVariable(
    "MODESWITCH_SCHEMA_REGISTRY_APP",
    parse_resolved_path,
    "dev tools: the folder of the schema registry application (Apicurio Registry) the tests "
    "and demos of registry-framed payloads start on loopback, which `make install` unpacks "
    "from `jvm/schema-registry/pom.xml`",
    default=REPOSITORY / ".schema-registry",
    shown="`.schema-registry/` at the repository's top",
)
KAFKA_BROKER_JARS = EnvironmentVariable(
    "MODESWITCH_KAFKA_BROKER_JARS",
    parse_resolved_path,
    "dev tools: the folder of the Apache Kafka broker's jars for the loopback broker of the "
    "demos and tests, which `make install` fetches from `jvm/kafka-broker/pom.xml`",
    default=REPOSITORY / ".kafka-broker",
    shown="`.kafka-broker/` at the repository's top",
)
DEMO_ENGINE = EnvironmentVariable(
    "MODESWITCH_DEMO_ENGINE",
    parse_text,
    "dev tools: the `engine` setting of `make demo` (the demo through Airflow); `submit` runs "
    "each epoch as its own `spark-submit` job instead of in the warm engine",
    default="auto",
)
FAULTS = EnvironmentVariable(
    "MODESWITCH_FAULTS",
    parse_fault_points,
    "tests: the fault points where a process pauses, as `name=seconds[@hit][,...]` "
    "(`modeswitch.faults`), so that a test can kill it there",
    default_factory=dict,
    shown="(none)",
)
FAULT_MARKERS = EnvironmentVariable(
    "MODESWITCH_FAULT_MARKERS",
    parse_path,
    "tests: the folder where a paused fault point leaves its marker and counts its calls",
)

ENVIRONMENT: tuple[EnvironmentVariable[Any], ...] = (
    SPARK_MASTER,
    JARS,
    CACHE,
    CDS,
    WORKERS_LIKE_HERE,
    ENGINE_DIR,
    ENGINE_SHARING,
    ENGINE_ADDRESS,
    ENGINE_TOKEN,
    STORAGE_OPTIONS,
    KAFKA_CONFIG,
    SCHEMA_REGISTRY_CONFIG,
    ALERTS_SCHEDULE,
    PIPELINE_RETRY_DELAY,
    BACKFILL_SCHEDULE,
    BACKFILL_MAX_ACTIVE_RUNS,
    MAINTENANCE_SCHEDULE,
    PIPELINES_DIR,
    KAFKA_BROKER_JARS,
    SCHEMA_REGISTRY_APP,
    DEMO_ENGINE,
    FAULTS,
    FAULT_MARKERS,
)
"""Every environment variable the package reads, in the docs' order."""


# --- reading -----------------------------------------------------------------------------------


def env_value(variable: EnvironmentVariable[T], environ: Mapping[str, str] | None = None) -> T:
    """``variable``'s value in ``environ`` (this process's environment by default), parsed; its
    default when it is unset or blank. A ConfigError names the variable and the bad value."""
    raw = env_text(variable, environ)
    if raw is None or not raw.strip():
        if variable.default_factory is not None:
            return variable.default_factory()
        return variable.default  # type: ignore[return-value]  # None where the type allows it
    return variable.parse(raw, variable=variable.name)


def env_default(variable: EnvironmentVariable[Any], value: str) -> str:
    """Set ``variable`` in this process's environment (and so its children's) unless it is
    set: what a command chooses for the processes it starts, leaving the user's choice be.
    Returns the text in effect."""
    return os.environ.setdefault(variable.name, value)


def env_text(
    variable: EnvironmentVariable[Any], environ: Mapping[str, str] | None = None
) -> str | None:
    """``variable``'s text in ``environ`` (this process's environment by default) exactly as
    set, None when unset: only to hand it on to another process as it is (a session's
    executors); to use it, :func:`env_value`."""
    return (os.environ if environ is None else environ).get(variable.name)


# --- the docs' table ---------------------------------------------------------------------------

TABLE_START = "<!-- environment-table:start: generated from modeswitch.environment.ENVIRONMENT -->"
TABLE_END = "<!-- environment-table:end -->"


def environment_table() -> str:
    """Every variable of :data:`ENVIRONMENT` as a row of a markdown table: its name, its
    default and its doc."""
    lines = ["| environment variable | default | what |", "|---|---|---|"]
    for variable in ENVIRONMENT:
        cells = (f"`{variable.name}`", variable.describe_default(), variable.doc)
        lines.append(markdown_row(cells))
    return "\n".join(lines) + "\n"


def with_environment_table(markdown: str) -> str:
    """``markdown`` with :func:`environment_table` between its lines :data:`TABLE_START` and
    :data:`TABLE_END`; a ConfigError when it has not one of each, in that order."""
    return with_generated_table(
        markdown, environment_table(), start=TABLE_START, end=TABLE_END, what="environment table"
    )


def markdown_row(cells: tuple[str, ...] | list[str]) -> str:
    """One row of a Markdown table, a ``|`` inside a cell escaped."""
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def with_generated_table(markdown: str, table: str, *, start: str, end: str, what: str) -> str:
    """``markdown`` with ``table`` between its lines ``start`` and ``end`` (the docs' generated
    tables: this one and the settings'); a ConfigError naming ``what`` when it has not one of
    each, in that order."""
    lines = markdown.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip() == start]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ConfigError(f"{what}: expected one line {start!r} and, after it, one line {end!r}")
    return "".join([*lines[: starts[0] + 1], table, *lines[ends[0] :]])
