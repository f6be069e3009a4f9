"""The epoch job operator: ``spark-submit jobs/<kind>.py`` for the epoch ``decide`` opened."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from modeswitch.airflow.backfill import require_backfill
from modeswitch.airflow.lineage import task_lineage
from modeswitch.airflow.settings import (
    connection_kafka_environment,
    connection_registry_environment,
    connection_storage_environment,
)
from modeswitch.airflow.tasks import require_running_epoch
from modeswitch.airflow.triggers import EngineEpochTrigger
from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError, ModeswitchError
from modeswitch.runners.base import EpochHandle, EpochKind, EpochRunner, runner_choice
from modeswitch.runners.engine import (
    EngineLostError,
    EngineRunner,
    credentials_fingerprint,
    engine_scratch,
    engine_target,
)
from modeswitch.runners.jobs import job_script
from modeswitch.runners.processes import SparkScratch
from modeswitch.runners.served import ServedEngineRunner, served_engine
from modeswitch.runners.session import spark_jars
from modeswitch.runners.submit import SubmitKind, SubmitPlan, submit_plan, this_machine


def require_spark_connection(conn_id: str) -> Any:
    """Refuse to submit without the connection: the Spark provider would silently use YARN.
    Returns the connection."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise ConfigError(
            f"Airflow connection {conn_id!r} is not defined; without it spark-submit would "
            f"target YARN. Define it, e.g. AIRFLOW_CONN_{conn_id.upper()}="
            '\'{"conn_type": "spark", "host": "local[*]"}\''
        ) from exc


def airflow_executor() -> str:
    """Airflow's ``[core] executor`` as this task's process sees it (empty if unset)."""
    from airflow.sdk.configuration import conf

    return conf.get("core", "executor", fallback="") or ""


class SparkSubmitRunner:
    """The ``submit`` runner (:mod:`modeswitch.runners.base`): the epoch's job through the
    Spark provider's own ``SparkSubmitOperator.execute`` (its hook, its log handling and
    ``on_kill``) for the epoch the operator was prepared for."""

    def __init__(self, operator: EpochJobOperator, context: Any) -> None:
        self.operator = operator
        self.context = context

    def start(self, kind: EpochKind, settings: PipelineSettings, epoch: int) -> EpochHandle:
        """The epoch's spark-submit, run by the handle's ``wait`` in this task; refuses an
        epoch the operator was not prepared for."""
        prepared = (self.operator.kind, self.operator.application_args)
        if kind != self.operator.kind or str(epoch) not in (self.operator.application_args or []):
            raise ModeswitchError(
                f"the {self.operator.task_id} task was prepared for {prepared}, "
                f"not {kind} epoch {epoch}"
            )
        return EpochHandle(kind, epoch, wait=lambda: self.operator.submit(self.context))

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        """Nothing outlives the task: spark-submit ended with its epoch."""


class EpochJobOperator(SparkSubmitOperator):
    """Run ``jobs/backlog_batch.py`` or ``jobs/stream.py`` for the epoch in ``decide``'s XCom.

    The epoch id and the resolved settings JSON come from ``decide_task_id``'s return value at
    run time; the job itself refuses an epoch that is no longer running (FencedError).

    ``deferrable`` (the default): an epoch handed to the warm engine is waited for in Airflow's
    triggerer (:class:`~modeswitch.airflow.triggers.EngineEpochTrigger`), the task deferred,
    holding no worker slot while the engine runs it; False waits in the task. A spark-submit
    per epoch always runs in the task, which owns it.
    """

    def __init__(
        self,
        *,
        kind: str,
        decide_task_id: str = "decide",
        conn_id: str = "spark_default",
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", f"modeswitch-{kind}")
        application = str(job_script(kind))  # a ValueError naming ``kind`` if unknown
        super().__init__(application=application, conn_id=conn_id, **kwargs)
        self.kind = kind
        self.decide_task_id = decide_task_id
        self.deferrable = deferrable

    def execute(self, context: Any) -> None:
        plan = context["ti"].xcom_pull(task_ids=self.decide_task_id)
        settings = self.prepare(plan or {})
        self._lineage_settings = settings
        if self.kind == "backfill":
            self.submit(context)
            return
        runner = self.epoch_runner(plan, settings, context)
        epoch = int(plan["epoch"])
        handle = runner.start(self.kind, settings, epoch)  # type: ignore[arg-type]
        if self.deferrable and handle.follow_at is not None:
            self.log.info("%s epoch %d: deferred until it ends", self.kind, epoch)
            self.defer(
                trigger=EngineEpochTrigger(
                    follow_at=handle.follow_at,
                    kind=self.kind,
                    epoch=epoch,
                    pipeline=handle.pipeline,
                ),
                method_name="engine_epoch_ended",
                timeout=self.execution_timeout,
            )
        handle.wait()

    def engine_epoch_ended(self, context: Any, event: Mapping[str, Any]) -> None:
        """Back from the triggerer (:class:`EngineEpochTrigger`): the epoch ended in the
        engine, failed there (its error, as if the task had waited), or the engine went away
        (:class:`EngineLostError`: the task's retry starts a new one and runs the epoch
        again, which re-attaches as after any lost engine)."""
        plan = context["ti"].xcom_pull(task_ids=self.decide_task_id) or {}
        if plan.get("settings"):
            self._lineage_settings = PipelineSettings.from_json(plan["settings"])
        status, where = event.get("status"), f"{event.get('kind')} epoch {event.get('epoch')}"
        if status == "done":
            self.log.info("%s ended in the engine", where)
            return
        if status == "failed":
            raise ModeswitchError(str(event.get("error")))
        raise EngineLostError(
            f"{event.get('error')}; the task's retry runs {where} again on an engine that answers "
            "(a new warm engine, or the served one once the deployment has restarted it)"
        )

    _lineage_settings: PipelineSettings | None = None
    _master = ""  # the Spark connection's master, lower case (set by prepare)

    def submit(self, context: Any) -> None:
        """The prepared job through the Spark provider's ``SparkSubmitOperator.execute``. On
        a local master, where the driver and the executors are this machine's JVM, its Spark
        scratch (:class:`~modeswitch.runners.processes.SparkScratch`) is a folder removed
        when spark-submit has ended, failed or not (the provider kills it on a failure)."""
        if not self._master.startswith("local"):
            SparkSubmitOperator.execute(self, context)
            return
        scratch = SparkScratch()
        saved = self.env_vars
        self.env_vars = {**scratch.environment(), **(saved or {})}
        self._hook = None  # built again with them
        try:
            SparkSubmitOperator.execute(self, context)
        finally:
            self.env_vars = saved
            scratch.remove()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """What the task read and wrote, for Airflow's OpenLineage provider
        (:mod:`modeswitch.airflow.lineage`)."""
        return task_lineage(self._lineage_settings)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return task_lineage(self._lineage_settings)

    def epoch_runner(
        self, plan: Mapping[str, Any], settings: PipelineSettings, context: Any
    ) -> EpochRunner:
        """The runner the settings choose for this task (:func:`runner_choice`, said in the
        log): a spark-submit of this task's job, or the pipeline's warm engine, started here
        with this task's connection, conf and environment if none runs (or if the one that
        runs, idle, has other credentials than this task's). The engine outlives the task."""
        name, why = runner_choice(
            settings.engine,
            airflow=True,
            deploy_mode=self._deploy_mode_used(),
            master=self._master,
            executor=airflow_executor(),
            served=served_engine(),
        )
        self.log.info("%s epoch %s: %s", self.kind, plan.get("epoch"), why)
        runners: dict[str, Callable[[], EpochRunner]] = {
            "warm": lambda: EngineRunner(
                lambda path: self.start_engine(plan, settings, path),
                # What start_engine would hand a new engine: this environment, the job's on top.
                credentials=credentials_fingerprint({**os.environ, **(self.env_vars or {})}),
            ),
            "served": ServedEngineRunner,
            "submit": lambda: SparkSubmitRunner(self, context),
        }
        return runners[name]()

    def _deploy_mode_used(self) -> str | None:
        """The deploy mode spark-submit will use: the operator's, else the connection's
        ``deploy-mode`` extra (as the Spark provider's hook resolves it)."""
        if self._deploy_mode:
            return self._deploy_mode
        connection = require_spark_connection(self._conn_id)
        return connection.extra_dejson.get("deploy-mode")

    def start_engine(
        self, plan: Mapping[str, Any], settings: PipelineSettings, address_file: Path
    ) -> Any:
        """``spark-submit jobs/engine.py`` in its own process group, its output beside its
        address file; it outlives this task (:func:`modeswitch.runners.engine.stop_engine`
        stops it, and removes its Spark scratch on a local master,
        :func:`~modeswitch.runners.engine.engine_scratch`).

        Its submit is built as every job's (:func:`~modeswitch.runners.submit.submit_plan`,
        from this task's deployment conf and environment). The Spark provider's public API
        cannot start it: ``SparkSubmitHook.submit`` waits for the application to end, and the
        engine must outlive this task in a process group of its own. So the command line is
        the provider's own (its hook's ``_build_spark_submit_command``, on a copy of this
        operator carrying the engine's plan: the same connection, deploy mode and options),
        started detached here."""
        from modeswitch.runners.processes import start_group

        engine = self.submit_plan_for(
            "engine", settings, "engine", engine_target(address_file), plan
        )
        command = self.with_plan(engine)._get_hook()._build_spark_submit_command(engine.application)
        env = dict(engine.env_vars)
        if self._master.startswith("local"):  # its driver's and executors' scratch
            env = {**SparkScratch(at=engine_scratch(address_file)).environment(), **env}
        with open(address_file.with_suffix(".log"), "ab") as output:
            return start_group(command, env=env, output=output)

    def with_plan(self, submit: SubmitPlan) -> EpochJobOperator:
        """A copy of this operator that submits ``submit`` (this one is left as it is)."""
        other = copy.copy(self)
        other.name, other.application = submit.name, submit.application
        other.application_args, other.conf = submit.application_args, submit.conf
        other.env_vars, other._hook = submit.env_vars, None
        return other

    def submit_plan_for(
        self,
        kind: SubmitKind,
        settings: PipelineSettings,
        label: str,
        target: list[str],
        plan: Mapping[str, Any],
    ) -> SubmitPlan:
        """:func:`submit_plan` with this task's deployment conf and environment (as the DAG
        gave them, before :meth:`prepare` set this epoch's) and the settings' Connections."""
        own_conf, own_env = self._deployment
        return submit_plan(
            kind,
            settings,
            label=label,
            target=target,
            config=plan["settings"],
            machine=this_machine(self._master),
            own_conf=own_conf,
            connection_env={
                **connection_storage_environment(settings),
                **connection_kafka_environment(settings),
                **connection_registry_environment(settings),
            },
            own_env=own_env,
        )

    _deployment: tuple[dict[str, str], dict[str, str]] = ({}, {})
    """The DAG's own ``conf`` and ``env_vars`` for this task (kept by :meth:`prepare`)."""

    def prepare(self, plan: Mapping[str, Any]) -> PipelineSettings:
        """Set the job's arguments, environment and Spark conf for ``plan``'s epoch
        (:func:`~modeswitch.runners.submit.submit_plan`); returns the plan's settings, parsed
        here once for the whole task.

        Storage credentials (the ``storage_connection`` setting's Connection extras), the
        Kafka client's configuration and the schema registry's go to spark-submit's environment
        only, never its command line: on YARN and Kubernetes the Spark provider turns
        environment variables into ``--conf`` arguments, so there those settings are refused.
        """
        if self.kind == "backfill":
            require_backfill(plan)
            target = ["--command", str(plan["command"])]
            label = f"backfill-{plan['command']}"
        else:
            require_running_epoch(plan, self.kind)
            target = ["--epoch", str(plan["epoch"])]
            label = f"{self.kind}-epoch-{plan['epoch']}"
        spark = require_spark_connection(self._conn_id)
        settings = PipelineSettings.from_json(plan["settings"])
        master = self._master = (spark.host or "").lower()
        on_a_cluster_manager = master.startswith("yarn") or master.startswith("k8s")
        if on_a_cluster_manager and connection_storage_environment(settings):
            raise ConfigError(
                f"storage_connection: spark-submit to {spark.host!r} would put the storage "
                "credentials on its command line (the Spark provider passes environment "
                "variables there as --conf); use the cluster's own credentials instead"
            )
        if on_a_cluster_manager and connection_kafka_environment(settings):
            raise ConfigError(
                f"kafka_connection: spark-submit to {spark.host!r} would put the Kafka client "
                "configuration on its command line (the Spark provider passes environment "
                "variables there as --conf)"
            )
        if on_a_cluster_manager and connection_registry_environment(settings):
            raise ConfigError(
                f"schema_registry_connection: spark-submit to {spark.host!r} would put the "
                "schema registry's client configuration on its command line (the Spark provider "
                "passes environment variables there as --conf)",
                setting="schema_registry_connection",
            )
        if "_deployment" not in vars(self):
            self._deployment = (dict(self.conf or {}), dict(self.env_vars or {}))
        job = self.submit_plan_for(self.kind, settings, label, target, plan)  # type: ignore[arg-type]
        self.name, self.application_args = job.name, job.application_args
        self.conf, self.env_vars = job.conf, job.env_vars
        if self.jars:  # the operator's --jars, which wins over spark.jars there
            self.jars = spark_jars(self.jars)
        self.log.info("%s: %s", label, self.application)
        self._hook = None  # built from the values above
        return settings
