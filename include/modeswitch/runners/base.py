"""The runner seam: how an epoch's Spark job runs, chosen once from the settings.

An :class:`EpochRunner` runs one batch or stream epoch that ``decide`` opened, and returns when
the epoch's job has ended (raising :class:`~modeswitch.errors.ModeswitchError` if it failed).
There are three, each usable under Airflow and from ``modeswitch run``:

- ``submit``: each epoch its own ``spark-submit`` through the Spark provider's hook
  (:class:`modeswitch.airflow.operators.EpochJobOperator`; Airflow only: outside Airflow there
  is no ``spark_default`` connection, and ``local`` does the same on the local master);
- ``engine``: the pipeline's warm engine, one long-lived Spark application that runs every
  epoch and hands a batch over to its stream itself
  (:class:`modeswitch.runners.engine.EngineRunner`);
- ``local``: each epoch's job a child process of this one, with the stream standby
  (:class:`modeswitch.runners.local.LocalRunner`).

:func:`choose_runner` makes the choice, a pure function of the ``engine`` setting, whether the
caller is an Airflow task and the Spark connection's deploy mode. The epoch lifecycle around
a runner (decide, run, close) is :func:`modeswitch.runners.lifecycle.run_one_epoch`.
"""

from __future__ import annotations

from typing import Literal, Protocol

from modeswitch.control.settings import ENGINES, PipelineSettings
from modeswitch.errors import ConfigError

EpochKind = Literal["batch", "stream"]
RunnerName = Literal["submit", "engine", "local"]


class EpochRunner(Protocol):
    """Runs epochs' jobs; :meth:`stop` stops whatever it started that outlives an epoch."""

    def run(self, kind: EpochKind, settings: PipelineSettings, epoch: int) -> None:
        """Run ``kind`` epoch ``epoch`` with ``settings`` to its end; raise if its job failed."""
        ...

    def alive(self) -> bool:
        """Whether what runs the epochs is up (a runner that starts a job per epoch: True)."""
        ...

    def stop(self) -> None:
        """Stop what this runner started and still runs (a standby, an engine it owns)."""
        ...


def choose_runner(engine: str, *, airflow: bool, deploy_mode: str | None = None) -> RunnerName:
    """The runner for the ``engine`` setting (``submit`` or ``warm``).

    - ``warm``: the warm engine, whose driver must run beside the task that talks to it: a
      Spark connection in ``cluster`` deploy mode is refused, naming both.
    - ``submit``: under Airflow a spark-submit per epoch; without Airflow (``modeswitch run``,
      the demo) a child process per epoch on the local master.
    """
    if engine not in ENGINES:
        raise ConfigError(f"engine: {engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "warm":
        if deploy_mode == "cluster":
            raise ConfigError(
                "engine: 'warm' needs the engine's driver beside the task that runs the epoch "
                "(client deploy mode); the Spark connection submits in cluster mode: set "
                "engine to 'submit' or the connection's deploy-mode to 'client'"
            )
        return "engine"
    return "submit" if airflow else "local"
