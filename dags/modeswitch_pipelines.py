"""Every modeswitch pipeline's DAGs, from one factory: ``modeswitch`` and one per file of the
pipelines folder (``MODESWITCH_PIPELINES_DIR``, ``pipelines/`` beside this file by default).

A pipeline ``P`` has five DAGs: ``P_pipeline`` (each run one epoch), ``P_control`` (one command
per run), ``P_backfill`` (one event-time window per run), ``P_maintenance`` and
``P_lag_alerts``. The ``modeswitch`` pipeline's are the DAGs one deployment always had. Wiring
only: the task callables live in ``modeswitch.airflow``; settings are read from Variables at run
time, never here (only each file's own settings are checked here). A file that declares no
pipeline (a bad name, a bad setting) is reported as this file's import error, naming the file
and the setting, and the other pipelines' DAGs stay (:class:`RefusedPipelines`).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Param, dag, task
from airflow.sdk.bases.timetable import BaseTimetable
from airflow.sdk.exceptions import AirflowTimetableInvalid

from modeswitch.airflow.alerts import TASK_ID, alerts_dag_options, lag_alert_task
from modeswitch.airflow.assets import sink_alias
from modeswitch.airflow.backfill import (
    backfill_dag_options,
    finish_backfill_task,
    plan_backfill_task,
)
from modeswitch.airflow.maintenance import maintain_task, maintenance_dag_options
from modeswitch.airflow.operators import EpochJobOperator
from modeswitch.airflow.settings import deployment_fleet
from modeswitch.airflow.tasks import (
    branch_for,
    close_task,
    decide_task,
    pipeline_task_defaults,
    submit_control_command,
)
from modeswitch.control.pipelines import Pipeline
from modeswitch.errors import ConfigError

START = pendulum.datetime(2026, 1, 1, tz="UTC")
CONTROL_COMMANDS = ["switch_to_batch", "switch_to_stream", "pause", "resume", "rewind"]


def _target_params(p: Pipeline) -> dict[str, Param]:
    """``modeswitch``'s backfill and maintenance DAGs take their target pipeline as a param
    (empty: the ``modeswitch_pipeline`` Variable's), as they always did; a declared
    pipeline's DAGs are its own."""
    if p.declared:
        return {}
    return {
        "pipeline": Param("", type="string", description="target pipeline; empty: the Variable's")
    }


def _about(p: Pipeline) -> str:
    where = f"declared by `{p.file}`" if p.declared else "the deployment's own pipeline"
    return (
        f"Pipeline **{p.name}** ({where}); its DAGs: "
        + ", ".join(f"`{p.dag_id(role)}`" for role in ("pipeline", "control", "backfill"))
        + f", `{p.dag_id('maintenance')}`, `{p.dag_id('lag_alerts')}`. "
        f"**[All pipelines](/modeswitch/)** · **[This one](/modeswitch/?pipeline={p.name})**."
    )


def pipeline_dag(p: Pipeline) -> None:
    dag_id = p.dag_id("pipeline")
    doc = f"""
### {dag_id}

{_about(p)}

One run = one **epoch**. `decide` resolves the settings (code defaults <
`modeswitch_config_file` < `modeswitch_<setting>` Variables < the pipeline's file <
`modeswitch_{p.name}_<setting>` Variables < the run's `settings` param; a declared pipeline
takes its source and tables from its own layers only), reads the control tables and the source's
offsets, applies pending commands and opens the epoch (or re-attaches to a running one after a
retry). Variables under `modeswitch_` that tune nothing are named in its log. The branch runs
the **backlog_batch** job (up to the recorded boundary) or the **stream** job (from the exact
handoff offsets, until the policy, a command or `max_stream_runtime` stops it). `close_epoch`
checks that every bucket reached its boundary, or records where the stream stopped and why.

Trigger params: `force_mode` (auto, batch, stream), `dry_run` (decide and show, write
nothing) and `settings` (per-run overrides, e.g. `{{"max_stream_runtime": "60s"}}`).

**Assets**: each closed epoch is an event on the sink table's Asset (and on the quarantine's
when it quarantined records), through the aliases `{dag_id}.sink` and `{dag_id}.quarantine`.
"""

    @dag(
        dag_id=dag_id,
        schedule="@continuous",
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["modeswitch", "spark", "delta", f"pipeline:{p.name}"],
        doc_md=doc,
        default_args=pipeline_task_defaults(),
        params={
            "force_mode": Param(
                "auto", type="string", enum=["auto", "batch", "stream"], description="override"
            ),
            "dry_run": Param(False, type="boolean", description="decide and show; write nothing"),
            "settings": Param({}, type="object", description="per-run overrides (raw strings)"),
        },
    )
    def pipeline():
        @task(task_id="decide", execution_timeout=timedelta(minutes=5))
        def decide(params=None, run_id=None):
            return decide_task(params, run_id=run_id, pipeline=p)

        @task.branch(task_id="branch", execution_timeout=timedelta(minutes=1))
        def branch(plan):
            return branch_for(plan)

        backlog_batch = EpochJobOperator(
            task_id="backlog_batch", kind="batch", execution_timeout=timedelta(hours=3)
        )
        stream = EpochJobOperator(
            task_id="stream", kind="stream", execution_timeout=timedelta(hours=1)
        )

        @task(
            task_id="close_epoch",
            trigger_rule="none_failed_min_one_success",
            execution_timeout=timedelta(minutes=5),
            # Each closed epoch is an event on the sink's Asset (and the quarantine's): the
            # tables are known at run time, so the events go through the DAG's aliases.
            outlets=[sink_alias(dag_id, "sink"), sink_alias(dag_id, "quarantine")],
        )
        def close(plan, outlet_events=None):
            return close_task(plan, outlet_events=outlet_events, dag_id=dag_id)

        plan = decide()
        branch(plan) >> [backlog_batch, stream]
        [backlog_batch, stream] >> close(plan)

    pipeline()


def control_dag(p: Pipeline) -> None:
    dag_id = p.dag_id("control")
    doc = f"""
### {dag_id}

{_about(p)}

Queue a command for the pipeline: `switch_to_batch`, `switch_to_stream`, `pause`, `resume`
or `rewind`. A running stream job applies switch and pause commands at its next commit
boundary (between micro-batches); otherwise the next `decide` applies them. `rewind` takes
either `offsets` (e.g. `{{"0": 120, "3": 0}}`) or `event_time` (ISO-8601: per bucket, the first
offset at or after it): the next `decide` deletes what the sink holds at or above those
offsets in one recorded commit and the next epoch reprocesses from there, exactly once (a
running stream stops for it; a running batch epoch finishes first). Bad params are refused
before anything is written; a rewind that no longer fits (above the committed offsets, below
retention) is rejected with the reason when `decide` applies it.
"""

    @dag(
        dag_id=dag_id,
        schedule=None,
        start_date=START,
        catchup=False,
        tags=["modeswitch", "control", f"pipeline:{p.name}"],
        doc_md=doc,
        default_args={"owner": "modeswitch", "retries": 0},
        params={
            "command": Param("pause", type="string", enum=CONTROL_COMMANDS),
            "offsets": Param(None, type=["null", "object"], description="rewind: bucket -> offset"),
            "event_time": Param(None, type=["null", "string"], description="rewind: ISO-8601"),
            "note": Param("", type="string", description="why (stored with the command)"),
            "settings": Param({}, type="object", description="setting overrides"),
        },
    )
    def control():
        @task(task_id="submit_command", execution_timeout=timedelta(minutes=10))
        def submit(params=None, run_id=None):
            return submit_control_command(params, run_id=run_id, pipeline=p, dag_id=dag_id)

        submit()

    control()


def backfill_dag(p: Pipeline) -> None:
    dag_id = p.dag_id("backfill")
    doc = f"""
### {dag_id}

{_about(p)}

One run = one **event-time window**: the run's data interval `[start, end)`. A record belongs
to the window that holds its event time, whatever its offset, so late records are included
and every record belongs to exactly one run of the schedule.

- `mode = fill`: load the window's records that the live pipeline never read (below where it
  started: a pipeline set to `start_from = latest` goes live at once and loads its history
  this way).
- `mode = reprocess`: re-derive the window's records the sink holds (after a transform fix).

Each run writes ONE Delta commit to the sink (and one to the quarantine) that replaces the
window's records, beside the running pipeline: no pause, nothing lost or doubled; a rerun
leaves the same rows. Use **Trigger DAG ▸ Backfill** (or `airflow backfill create
--dag-id {dag_id} --from-date … --to-date …`) for a range of windows. Refused, with the
reason, before anything is written: a window that ends in the future or lies beyond the log's
retention, a pipeline with nothing committed, and a window that another run is backfilling.
Params: `mode`, `buckets` (empty: all), `settings` (other setting overrides)
{"" if p.declared else "and `pipeline` (empty: the `modeswitch_pipeline` Variable's)"}.
"""

    @dag(
        dag_id=dag_id,
        start_date=START,
        catchup=False,
        tags=["modeswitch", "backfill", f"pipeline:{p.name}"],
        doc_md=doc,
        default_args={"owner": "modeswitch", "retries": 1, "retry_delay": timedelta(seconds=30)},
        params={
            **_target_params(p),
            "mode": Param("fill", type="string", enum=["fill", "reprocess"]),
            "buckets": Param([], type="array", description="buckets to backfill; empty: all"),
            "settings": Param({}, type="object", description="setting overrides"),
        },
        **backfill_dag_options(),
    )
    def backfill():
        @task(task_id="plan", execution_timeout=timedelta(minutes=10))
        def plan(params=None, run_id=None, data_interval_start=None, data_interval_end=None):
            return plan_backfill_task(
                params,
                run_id=run_id,
                data_interval_start=data_interval_start,
                data_interval_end=data_interval_end,
                pipeline=p,
                dag_id=dag_id,
            )

        job = EpochJobOperator(
            task_id="backfill",
            kind="backfill",
            decide_task_id="plan",
            execution_timeout=timedelta(hours=3),
        )

        @task(
            task_id="finish",
            trigger_rule="all_done",
            execution_timeout=timedelta(minutes=5),
            # A window that landed is an event on the sink's Asset, as a closed epoch is.
            outlets=[sink_alias(dag_id, "sink"), sink_alias(dag_id, "quarantine")],
        )
        def finish(plan, outlet_events=None):
            return finish_backfill_task(plan, outlet_events=outlet_events, dag_id=dag_id)

        planned = plan()
        planned >> job >> finish(planned)

    backfill()


def maintenance_dag(p: Pipeline) -> None:
    dag_id = p.dag_id("maintenance")
    doc = f"""
### {dag_id}

{_about(p)}

A stream commits every micro-batch, so the sink gathers small files and log entries, and the
control tables grow. Each run, **while the pipeline runs**: compacts the sink's and the
quarantine's small files (`compact_target_mb`), checkpoints their Delta logs, cleans log
files past `delta.logRetentionDuration` and vacuums files removed more than
`vacuum_retention` ago; merges old `progress` rows (`progress_horizon`), rewrites and vacuums
the control tables; deletes the Spark checkpoints of ended stream epochs beyond
`stream_checkpoints_kept`. One run at a time per pipeline (its maintenance lease). Params:
`settings`{"" if p.declared else ", `pipeline` (empty: the `modeswitch_pipeline` Variable's)"}.
"""

    @dag(
        dag_id=dag_id,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["modeswitch", "maintenance", f"pipeline:{p.name}"],
        doc_md=doc,
        default_args={"owner": "modeswitch", "retries": 1, "retry_delay": timedelta(minutes=1)},
        params={
            **_target_params(p),
            "settings": Param({}, type="object", description="setting overrides"),
        },
        **maintenance_dag_options(),
    )
    def maintenance():
        @task(task_id="maintain", execution_timeout=timedelta(minutes=50))
        def maintain(params=None, run_id=None):
            return maintain_task(params, run_id=run_id, pipeline=p, dag_id=dag_id)

        maintain()

    maintenance()


def lag_alerts_dag(p: Pipeline) -> None:
    dag_id = p.dag_id("lag_alerts")
    doc = f"""
### {dag_id}

{_about(p)}

Each run measures the pipeline's watermark lag and offset lag (as `decide` does, without
Spark). When one stays above its **alert** threshold (`alert_watermark_lag`,
`alert_offset_lag`) for `alert_after`, the notifiers named by `alert_notifiers` are called
once; once the lag is back under, once more. Each alert is also in the pipeline's decisions
(`decided_by = alerts`). Runs apart from the pipeline DAG, so a pipeline whose own runs are
stuck is still watched (`MODESWITCH_ALERTS_SCHEDULE`). Skipped while no alert threshold is set.
"""

    @dag(
        dag_id=dag_id,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["modeswitch", "alerts", f"pipeline:{p.name}"],
        doc_md=doc,
        default_args={"owner": "modeswitch", "retries": 0},
        params={"settings": Param({}, type="object", description="setting overrides")},
        **alerts_dag_options(),
    )
    def lag_alerts():
        @task(task_id=TASK_ID, execution_timeout=timedelta(minutes=2))
        def check_lag(params=None, **context):
            return lag_alert_task(
                {"params": params, **context},
                overrides=(params or {}).get("settings"),
                pipeline=p,
            )

        check_lag()

    lag_alerts()


FACTORIES = (pipeline_dag, control_dag, backfill_dag, maintenance_dag, lag_alerts_dag)


class RefusedPipelines(BaseTimetable):
    """The schedule of a DAG that stands for the files that declare no pipeline: Airflow
    validates a timetable as it bags the DAG, and a failed validation is the DAG file's import
    error while the file's other DAGs are bagged. So each refused file is named, with its
    setting, on Airflow's import errors, and the other pipelines run."""

    can_be_scheduled = False

    def __init__(self, refused: dict[str, str]) -> None:
        self.refused = refused

    def validate(self) -> None:
        lines = [
            why if why.startswith(file) else f"{file}: {why}"
            for file, why in sorted(self.refused.items())
        ]
        raise AirflowTimetableInvalid(
            "pipeline files that declare no pipeline (their DAGs are left out):\n"
            + "\n".join(lines)
        )


def declare_all() -> dict[str, str]:
    """Each pipeline's DAGs; returns the refused files, each with why."""
    fleet = deployment_fleet(__file__.rsplit("/", 1)[0])
    refused = dict(fleet.refused)
    for p in fleet.pipelines:
        try:
            p.own_settings()
        except ConfigError as exc:
            refused[str(p.file)] = str(exc)
            continue
        for factory in FACTORIES:
            factory(p)
    if refused:
        dag(
            dag_id="modeswitch_refused_pipelines",
            schedule=RefusedPipelines(refused),
            start_date=START,
            tags=["modeswitch"],
        )(lambda: None)()
    return refused


REFUSED = declare_all()
