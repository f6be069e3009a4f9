"""The epoch job operator: ``spark-submit jobs/<kind>.py`` for the epoch ``decide`` opened."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from modeswitch.airflow.tasks import require_running_epoch
from modeswitch.errors import ConfigError
from modeswitch.jvm import java_options, with_java_options
from modeswitch.orchestration import JOBS

JOB_SCRIPTS = {"batch": "backlog_batch.py", "stream": "stream.py"}


def require_spark_connection(conn_id: str) -> None:
    """Refuse to submit without the connection: the Spark provider would silently use YARN."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise ConfigError(
            f"Airflow connection {conn_id!r} is not defined; without it spark-submit would "
            f"target YARN. Define it, e.g. AIRFLOW_CONN_{conn_id.upper()}="
            '\'{"conn_type": "spark", "host": "local[*]"}\''
        ) from exc


def job_environment() -> dict[str, str]:
    """spark-submit from this interpreter's environment, running the job with this Python."""
    bin_dir = str(Path(sys.executable).parent)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


class EpochJobOperator(SparkSubmitOperator):
    """Run ``jobs/backlog_batch.py`` or ``jobs/stream.py`` for the epoch in ``decide``'s XCom.

    The epoch id and the resolved settings JSON come from ``decide_task_id``'s return value at
    run time; the job itself refuses an epoch that is no longer running (FencedError).
    """

    def __init__(
        self,
        *,
        kind: str,
        decide_task_id: str = "decide",
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        if kind not in JOB_SCRIPTS:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(JOB_SCRIPTS)}")
        kwargs.setdefault("name", f"modeswitch-{kind}")
        super().__init__(application=str(JOBS / JOB_SCRIPTS[kind]), conn_id=conn_id, **kwargs)
        self.kind = kind
        self.decide_task_id = decide_task_id

    def execute(self, context: Any) -> None:
        plan = context["ti"].xcom_pull(task_ids=self.decide_task_id)
        require_running_epoch(plan or {}, self.kind)
        require_spark_connection(self._conn_id)
        self.application_args = [
            "--pipeline",
            plan["pipeline"],
            "--epoch",
            str(plan["epoch"]),
            "--config",
            plan["settings"],
        ]
        self.env_vars = {**job_environment(), **(self.env_vars or {})}
        self.conf = {
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            **(self.conf or {}),
        }
        # spark-submit starts the driver JVM: map the class archive there (modeswitch.jvm).
        options = with_java_options(self.conf.get("spark.driver.extraJavaOptions"), java_options())
        if options:
            self.conf["spark.driver.extraJavaOptions"] = options
        self.name = f"modeswitch-{plan['pipeline']}-{self.kind}-epoch-{plan['epoch']}"
        self.log.info("epoch %s (%s): %s", plan["epoch"], self.kind, self.application)
        self._hook = None  # built from the values above
        super().execute(context)
