"""A pipeline whose epoch quarantines most of its records says so loudly: in the job's log
(batch waves: tests/spark/test_user_payload.py; stream micro-batches: the supervisor here), on
the status and in ``modeswitch status``, and in the next decision's reason. Sink commits are
made with the functions the Spark driver calls, on real control tables, without Spark."""

from __future__ import annotations

import io
import logging

import pendulum
import pytest
from rich.console import Console
from test_status import LATEST, PIPELINE, commit, layers  # noqa: F401 (layers: a fixture)

from modeswitch.control.quarantine import QuarantineWatch, describe_quarantine, quarantines_most
from modeswitch.control.settings_layers import layer_settings
from modeswitch.modes.stream import StreamSupervisor
from modeswitch.ops.status import pipeline_status
from modeswitch.ops.status_view import render_status
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sinks.commits import (
    OTHER_REASONS,
    REASONS_PER_TASK,
    add_reasons,
    latest_sink_commit,
)
from modeswitch.state import StateStore

pytestmark = pytest.mark.unit

ALL = {0: (0, LATEST[0]), 1: (0, LATEST[1])}  # 140 records
BAD = {(0, o) for o in range(100)}  # 100 of them quarantined: 71.4 %


def test_the_line_is_more_than_the_fraction_of_what_was_committed() -> None:
    assert not quarantines_most(0, 0, 0.5)
    assert not quarantines_most(50, 50, 0.5)  # exactly half is not most
    assert quarantines_most(49, 51, 0.5)
    assert not quarantines_most(1, 9, 1.0)
    assert describe_quarantine(3, 1_067, 116_743, reason="field event_id is missing") == (
        "epoch 3 quarantined 116,743 of 117,810 records (99.1%); most common reason: "
        "field event_id is missing"
    )


def test_a_watch_warns_once_per_epoch_naming_the_pipeline_counts_and_reason() -> None:
    watch = QuarantineWatch("orders", 7, 0.5)
    assert watch.add(100, 10, {"value is empty": 10}) is None
    warning = watch.add(0, 200, {"field id is missing or not an integer": 190, "x": 10})
    assert warning == (
        "pipeline 'orders': epoch 7 quarantined 210 of 310 records (67.7%); most common "
        "reason: field id is missing or not an integer so far, more than "
        "quarantine_warn_fraction = 0.5; does the payload match value_format and its schema "
        "(or the transform)?"
    )
    assert watch.add(0, 500, {"x": 500}) is None  # once per epoch


def test_a_task_keeps_a_bounded_number_of_distinct_reasons() -> None:
    counts: dict[str, int] = {}
    add_reasons(counts, {f"value {i} is odd": 1 for i in range(REASONS_PER_TASK + 5)})
    add_reasons(counts, {"value 0 is odd": 2})
    assert len(counts) == REASONS_PER_TASK + 1
    assert counts[OTHER_REASONS] == 5 and counts["value 0 is odd"] == 3


def test_an_epoch_that_quarantines_most_is_flagged_in_status_and_the_next_decision(
    layers: list,  # noqa: F811
) -> None:
    settings = layer_settings(*layers)
    plan = decide(settings, force_mode="batch")
    commit(settings, plan.epoch, 0, ALL, bad=BAD)
    sink_commit = latest_sink_commit(settings.sink, PIPELINE)
    assert sink_commit is not None
    assert (sink_commit.records, sink_commit.quarantined) == (40, 100)
    assert sink_commit.quarantine_reasons == {"not JSON": 100}
    store = StateStore.from_settings(settings)
    assert store.progress.epoch_summaries(plan.epoch)[plan.epoch]["quarantined"] == 100

    status = pipeline_status(settings)
    (epoch,) = status["epochs"]
    assert epoch["quarantines_most"] is True
    assert epoch["quarantine_share"] == pytest.approx(100 / 140)
    assert status["warnings"] == [
        f"epoch {plan.epoch} quarantined 100 of 140 records (71.4%); most common reason: "
        "not JSON: more than quarantine_warn_fraction = 0.5; does the payload match "
        "value_format and its schema (or the transform)?"
    ]
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(render_status(status))
    assert f"warning: epoch {plan.epoch} quarantined 100 of 140 records (71.4%)" in out.getvalue()

    close_epoch(settings, plan.epoch)
    after = decide(settings, force_mode="stream")
    expected = (
        f"warning: epoch {plan.epoch} quarantined 100 of 140 records (71.4%), more than "
        "quarantine_warn_fraction = 0.5"
    )
    assert after.reason.endswith(expected)
    assert store.decisions.list(limit=1)[0].reason == after.reason  # recorded
    assert store.epochs.get(after.epoch).reason == after.reason


def test_below_the_line_nothing_is_flagged(layers: list) -> None:  # noqa: F811
    settings = layer_settings(*layers, ("run params", {"quarantine_warn_fraction": "0.8"}))
    plan = decide(settings, force_mode="batch")
    commit(settings, plan.epoch, 0, ALL, bad=BAD)
    status = pipeline_status(settings)
    assert status["warnings"] == [] and status["epochs"][0]["quarantines_most"] is False
    close_epoch(settings, plan.epoch)
    assert "warning" not in decide(settings, force_mode="stream").reason


def test_a_stream_warns_in_its_log_once_when_its_micro_batches_quarantine_most(
    layers: list,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = layer_settings(*layers)
    plan = decide(settings, force_mode="stream")
    store = StateStore.from_settings(settings)
    now = pendulum.now("UTC")
    supervisor = StreamSupervisor(settings, store, plan.epoch, now, lambda: now)

    def warnings() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno >= logging.WARNING]

    with caplog.at_level(logging.WARNING, logger="modeswitch.modes.stream"):
        commit(settings, plan.epoch, 0, {0: (0, 20), 1: (0, 20)}, bad={(0, 1)})
        supervisor.follow_commits()
        assert warnings() == []  # 1 of 40
        commit(settings, plan.epoch, 1, {0: (20, 100)}, bad={(0, o) for o in range(20, 100)})
        supervisor.follow_commits()
        commit(settings, plan.epoch, 2, {1: (20, 40)}, bad={(1, o) for o in range(20, 40)})
        supervisor.follow_commits()
    (record,) = warnings()
    assert record.name == "modeswitch.modes.stream"
    assert record.getMessage().startswith(
        f"pipeline '{PIPELINE}': epoch {plan.epoch} quarantined 81 of 120 records (67.5%); "
        "most common reason: not JSON so far"
    )
