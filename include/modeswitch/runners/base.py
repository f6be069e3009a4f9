"""The runner seam: how an epoch's Spark job runs, chosen once from the settings.

An :class:`EpochRunner` starts one batch or stream epoch that ``decide`` opened and gives an
:class:`EpochHandle`, whose ``wait`` returns when the epoch's job has ended (raising
:class:`~modeswitch.errors.ModeswitchError` if it failed), and whose ``follow_at``, when
set, lets another process follow the epoch instead (the Airflow task defers to its trigger on
it; no caller asks which runner it has). There are four, each usable under Airflow and from
``modeswitch run``:

- ``submit``: each epoch its own ``spark-submit`` through the Spark provider's hook
  (:class:`modeswitch.airflow.operators.EpochJobOperator`; Airflow only: outside Airflow there
  is no ``spark_default`` connection, and ``local`` does the same on the local master);
- ``warm``: the pipeline's warm engine, one long-lived Spark application that runs every
  epoch and hands a batch over to its stream itself
  (:class:`modeswitch.runners.engine.EngineRunner`);
- ``local``: each epoch's job a child process of this one, with the stream standby
  (:class:`modeswitch.runners.local.LocalRunner`);
- ``served``: the deployment's engine, the same server run as a service of its own (the
  compose stack's ``engine``), reached at ``MODESWITCH_ENGINE_ADDRESS`` with a token
  (:class:`modeswitch.runners.engine.ServedEngineRunner`).

:func:`runner_choice` makes the choice, a pure function of the ``engine`` setting, whether the
caller is an Airflow task, the Spark connection's master and deploy mode and Airflow's
executor. The epoch lifecycle around a runner (decide, run, close) is
:func:`modeswitch.runners.pipeline_run.run_one_epoch`; the engine's own handoff from a batch to
its stream is :func:`modeswitch.runners.lifecycle.hand_off_to_stream`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from modeswitch.control.settings import ENGINES, PipelineSettings
from modeswitch.errors import ConfigError

EpochKind = Literal["batch", "stream"]
RunnerName = Literal["submit", "warm", "local", "served"]
"""The runners, named as the ``engine`` setting names them: ``submit`` and ``warm`` are its
values (``auto`` chooses one of them), ``local`` is what ``submit`` is outside Airflow and
``served`` what ``warm`` is where the deployment runs the engine as a service."""


@dataclass(frozen=True)
class EpochHandle:
    """An epoch a runner started (:meth:`EpochRunner.start`): :attr:`wait` follows it to its
    end; where another process can follow it too, :attr:`follow_at` says where."""

    kind: EpochKind
    epoch: int
    wait: Callable[[], None]
    """Block until the epoch's job has ended; raise if it failed. A runner whose job runs in
    the caller's process tree starts it here."""
    follow_at: str | None = None
    """Where what runs the epoch is found, for a process other than this one to follow it
    without running it (an Airflow trigger): the warm engine's address file, or a served
    engine's ``HOST:PORT`` (:func:`modeswitch.runners.engine.engine_at`); None when only
    :attr:`wait` can."""
    pipeline: str = ""
    """The pipeline whose epoch it is (a shared engine runs several, a lane each)."""


class EpochRunner(Protocol):
    """Runs epochs' jobs; :meth:`stop` stops whatever it started that outlives an epoch."""

    def start(self, kind: EpochKind, settings: PipelineSettings, epoch: int) -> EpochHandle:
        """Start ``kind`` epoch ``epoch`` with ``settings`` (or, for a job of the caller's own
        process tree, get ready to); ``start(...).wait()`` runs it to its end."""
        ...

    def alive(self) -> bool:
        """Whether what runs the epochs is up (a runner that starts a job per epoch: True)."""
        ...

    def stop(self) -> None:
        """Stop what this runner started and still runs (a standby, an engine it owns)."""
        ...


LOCAL_EXECUTORS = ("LocalExecutor", "SequentialExecutor", "DebugExecutor")
"""Airflow executors that run every task on the scheduler's host: the only ones under which
``engine = auto`` chooses the warm engine."""


def runner_choice(
    engine: str,
    *,
    airflow: bool,
    deploy_mode: str | None = None,
    master: str | None = None,
    executor: str | None = None,
    served: str | None = None,
) -> tuple[RunnerName, str]:
    """The runner for the ``engine`` setting (``auto``, ``submit`` or ``warm``) and why, in
    words for the task's log.

    - ``warm``: the warm engine, whose driver must run beside the task that talks to it: a
      Spark connection in ``cluster`` deploy mode is refused, naming both.
    - ``submit``: under Airflow a spark-submit per epoch; without Airflow (``modeswitch run``,
      the demo) a child process per epoch on the local master.
    - ``auto`` (the default): ``warm`` wherever the engine works as designed, ``submit``
      where it does not (:func:`_why_not_warm`: cluster deploy mode, a YARN or Kubernetes
      master, an Airflow executor that runs tasks on other hosts). ``modeswitch run`` always
      runs on the local master: the engine.

    - ``served``: where the deployment runs the engine as a service (``served``: its
      ``HOST:PORT``, ``MODESWITCH_ENGINE_ADDRESS``), ``warm`` and ``auto`` hand the epochs to
      it, whatever the executor and deploy mode: its driver is its own, reached over the
      network; ``submit`` still means a job per epoch.

    ``master`` is the Spark connection's (under Airflow), ``executor`` Airflow's
    ``[core] executor``.
    """
    if engine not in ENGINES:
        raise ConfigError(f"engine: {engine!r} is not one of {', '.join(ENGINES)}")
    per_epoch: RunnerName = "submit" if airflow else "local"
    if served and engine != "submit":
        return "served", f"engine = {engine}: the deployment's served engine at {served}"
    if engine == "warm":
        if deploy_mode == "cluster":
            raise ConfigError(
                "engine: 'warm' needs the engine's driver beside the task that runs the epoch "
                "(client deploy mode); the Spark connection submits in cluster mode: set "
                "engine to 'submit' or the connection's deploy-mode to 'client'"
            )
        return "warm", "engine = warm: the pipeline's warm engine"
    if engine == "submit":
        return per_epoch, "engine = submit: a job per epoch"
    why_not = _why_not_warm(deploy_mode=deploy_mode, master=master, executor=executor)
    if why_not:
        return per_epoch, f"engine = auto: a job per epoch, not the warm engine: {why_not}"
    where = f"master {master}" if master else "the local master"
    return "warm", f"engine = auto: the pipeline's warm engine ({where}, driver beside the tasks)"


def _why_not_warm(
    *, deploy_mode: str | None, master: str | None, executor: str | None
) -> str | None:
    """Why ``auto`` does not choose the warm engine here, or None where it does."""
    if deploy_mode == "cluster":
        return (
            "the Spark connection submits in cluster deploy mode, so an engine's driver would "
            "not run beside the tasks that talk to it on loopback"
        )
    cluster_manager = (master or "").lower()
    if cluster_manager.startswith(("yarn", "k8s://")):
        return (
            f"master {master!r}: an application that never ends would hold the cluster "
            "manager's executors between epochs (set engine = warm to have it anyway)"
        )
    remote = [name for name in _executor_names(executor) if name not in LOCAL_EXECUTORS]
    if remote:
        return (
            f"Airflow's executor {', '.join(remote)} may run tasks on other hosts, and each host "
            "would start an engine of its own (tasks find the engine through a file on theirs)"
        )
    return None


def _executor_names(executor: str | None) -> list[str]:
    """The class names in Airflow's ``[core] executor`` (a list, each maybe ``alias:path``)."""
    names = []
    for entry in (executor or "").split(","):
        entry = entry.strip().rsplit(":", 1)[-1].strip()
        if entry:
            names.append(entry.rsplit(".", 1)[-1])
    return names
