"""What a ``spark-submit`` of one of our jobs carries: its name, entrypoint, arguments, Spark
conf and environment, built by one pure function for every job the deployment submits (an
epoch's ``batch``/``stream`` job, a ``backfill``, the warm ``engine``).

:func:`submit_plan` decides; the Airflow operator hands the result to the Spark provider (its
``SparkSubmitOperator`` runs an epoch's job; the engine, which must outlive the task, is started
detached from the same provider's command line). ``modeswitch run``'s engine is the same
entrypoint with the same arguments (:func:`job_arguments`) under this Python.

What the builder reads from this machine (the interpreters, the fetched jars, the class
archive's JVM option) is gathered apart, once, by :func:`this_machine`, so the decision itself
is a pure function of its inputs with a unit test per rule.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from modeswitch.control.settings import PipelineSettings
from modeswitch.environment import KAFKA_CONFIG, env_value
from modeswitch.runners.jobs import job_script, job_spark_conf
from modeswitch.runners.jvm import java_options, with_java_options
from modeswitch.sources import log_type
from modeswitch.sources.kafka_security import with_java_properties

SubmitKind = Literal["batch", "stream", "backfill", "engine"]


@dataclass(frozen=True)
class SubmitMachine:
    """What a submit reads from the machine it is built on."""

    driver_python: str
    """The interpreter of the driver (and of spark-submit's PATH): this one."""
    worker_python: str
    """The interpreter of the Python workers for the master (:func:`python_for`)."""
    jars: tuple[str, ...]
    """The jars ``make install`` fetched (:func:`modeswitch.runners.jvm.fetched_jars`)."""
    java_options: str
    """The driver JVM's class-archive option, or "" (:func:`~.jvm.java_options`)."""
    search_path: str = ""
    """This process's ``PATH``, behind the driver interpreter's folder in spark-submit's."""


def this_machine(master: str) -> SubmitMachine:
    """The :class:`SubmitMachine` of this process for a job on ``master``."""
    from modeswitch.runners.jvm import fetched_jars
    from modeswitch.runners.worker_python import python_for

    return SubmitMachine(
        driver_python=sys.executable,
        worker_python=python_for(master),
        jars=tuple(fetched_jars()),
        java_options=java_options(),
        search_path=os.environ.get("PATH", ""),
    )


@dataclass(frozen=True)
class SubmitPlan:
    """One ``spark-submit`` of ours: the Spark provider's operator and hook take these fields
    as they are (``name``, ``application``, ``application_args``, ``conf``, ``env_vars``)."""

    name: str
    application: str
    application_args: list[str]
    conf: dict[str, str]
    env_vars: dict[str, str] = field(default_factory=dict)


def job_arguments(pipeline: str, target: Sequence[str], config: str) -> list[str]:
    """A job entrypoint's arguments (:mod:`modeswitch.runners.jobs`): ``--pipeline``, the
    target (``--epoch N``, ``--command N`` or ``--address-file PATH``) and ``--config``."""
    return ["--pipeline", pipeline, *target, "--config", config]


def sizing_kind(kind: SubmitKind) -> Literal["batch", "stream", "backfill"]:
    """Whose driver sizing a job takes: the engine's is a batch job's, since it runs batch
    epochs too (:func:`modeswitch.runners.jobs.job_spark_conf`)."""
    return "batch" if kind == "engine" else kind


def submit_plan(
    kind: SubmitKind,
    settings: PipelineSettings,
    *,
    label: str,
    target: Sequence[str],
    config: str,
    machine: SubmitMachine,
    own_conf: Mapping[str, str] | None = None,
    connection_env: Mapping[str, str] | None = None,
    own_env: Mapping[str, str] | None = None,
) -> SubmitPlan:
    """The ``spark-submit`` of ``kind``'s job for ``settings``' pipeline (``label`` names it,
    ``target`` is what it runs and ``config`` the settings it is handed as they were resolved:
    see :func:`job_arguments`).

    - **conf**: the Python workers' and the driver's interpreters, then the driver's sizing
      from the settings (:func:`sizing_kind`) unless the deployment's conf (``own_conf``) sizes
      the driver itself, then the deployment's conf, which wins key by key; spark-submit starts
      the driver JVM, so our jars go on ``spark.jars`` after the deployment's own, Delta's
      session settings are added where the deployment set none, and the class archive's JVM
      option joins the driver's options. For a Kafka source whose client configuration (in
      the environment below) logs in at an OAuth token endpoint, the driver's and executors'
      options allow its URL (:func:`~modeswitch.sources.kafka_security.with_java_properties`;
      a deployment's own list of allowed URLs is left as it is).
    - **environment**: spark-submit found on this interpreter's PATH and the job run with this
      Python, then the Connections' environment (``connection_env``: storage credentials, the
      Kafka client's configuration, the schema registry's), then the deployment's own
      (``own_env``), which wins.
    """
    from modeswitch.runners.session import DELTA_SPARK_CONF

    own = dict(own_conf or {})
    sizing = {} if "spark.driver.memory" in own else job_spark_conf(sizing_kind(kind), settings)
    conf = {
        "spark.pyspark.python": machine.worker_python,
        "spark.pyspark.driver.python": machine.driver_python,
        **sizing,
        **own,
    }
    if "spark.driver.extraJavaOptions" in sizing and "spark.driver.extraJavaOptions" in own:
        conf["spark.driver.extraJavaOptions"] = with_java_options(
            own["spark.driver.extraJavaOptions"], sizing["spark.driver.extraJavaOptions"]
        )
    deployment_jars = [jar.strip() for jar in conf.get("spark.jars", "").split(",") if jar.strip()]
    conf["spark.jars"] = ",".join(dict.fromkeys([*deployment_jars, *machine.jars]))
    for key, value in DELTA_SPARK_CONF.items():
        conf.setdefault(key, value)
    options = with_java_options(conf.get("spark.driver.extraJavaOptions"), machine.java_options)
    if options:
        conf["spark.driver.extraJavaOptions"] = options
    bin_dir = str(Path(machine.driver_python).parent)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{machine.search_path}",
        "PYSPARK_PYTHON": machine.driver_python,
        "PYSPARK_DRIVER_PYTHON": machine.driver_python,
        **(connection_env or {}),
        **(own_env or {}),
    }
    if log_type(settings.source).client_config:  # MODESWITCH_KAFKA_CONFIG is its client's
        kafka = env_value(KAFKA_CONFIG, env)
        for side in ("driver", "executor"):
            key = f"spark.{side}.extraJavaOptions"
            if jvm := with_java_properties(conf.get(key), kafka):
                conf[key] = jvm
    return SubmitPlan(
        name=f"modeswitch-{settings.pipeline}-{label}",
        application=str(job_script(kind)),
        application_args=job_arguments(settings.pipeline, target, config),
        conf=conf,
        env_vars=env,
    )
