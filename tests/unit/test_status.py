"""``modeswitch status`` without Spark: the facts :func:`pipeline_status` reads from real
control tables and a real segment log (sink commits made with the functions the Spark driver
calls), the text ``render_status`` prints for a fixed status (golden, tolerant of widths), and
the command line's refusals."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from rich.console import Console

from modeswitch import cli
from modeswitch.control.settings_layers import layer_settings, setting_origins
from modeswitch.errors import ModeswitchError
from modeswitch.ops.status import pipeline_status
from modeswitch.ops.status_view import render_status
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sinks.commits import latest_sink_commit
from modeswitch.sinks.delta import DeltaSinkOptions, commit_files, write_files
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms import QUARANTINE_REASON

PIPELINE = "orders"
LATEST = {0: 100, 1: 40}
T0 = datetime(2026, 1, 1, tzinfo=UTC)
GOLDEN = Path(__file__).parent / "golden" / "status.txt"


@pytest.fixture
def layers(tmp_path: Path) -> list:
    log = SegmentLog.create(str(tmp_path / "log"), buckets=len(LATEST), open_segment_seconds=0)
    for bucket, count in LATEST.items():
        log.append(
            bucket,
            pa.table(
                {
                    "event_time": [T0 + timedelta(seconds=o) for o in range(count)],
                    "key": [f"k{o}" for o in range(count)],
                    "value": [f"v{bucket}-{o}" for o in range(count)],
                }
            ),
        )
    file_layer = {
        "pipeline": PIPELINE,
        "source": str(tmp_path / "log"),
        "warehouse": str(tmp_path / "warehouse"),
        "enter_threshold": "10m",
    }
    return [("config file p.toml:", file_layer), ("command line:", {"exit_threshold": "20s"})]


def commit(
    settings, epoch: int, sequence: int, ranges: dict[int, tuple[int, int]], bad=frozenset()
) -> None:
    """One sink commit of the records of ``ranges``, as a batch wave makes it; the positions
    in ``bad`` are quarantined."""
    options = DeltaSinkOptions.parse(
        {"path": settings.sink, "pipeline": PIPELINE, "epoch": str(epoch)}
        | {"quarantinePath": settings.quarantine}
    )
    rows = [(b, o) for b, (lo, hi) in sorted(ranges.items()) for o in range(lo, hi)]
    batch = pa.RecordBatch.from_pydict(
        {
            "bucket": pa.array([b for b, _ in rows], pa.int32()),
            "offset": pa.array([o for _, o in rows], pa.int64()),
            "event_time": pa.array(
                [T0 + timedelta(seconds=o) for _, o in rows], pa.timestamp("us", tz="UTC")
            ),
            "key": pa.array([f"k{o}" for _, o in rows], pa.string()),
            "value": pa.array([f"v{b}-{o}" for b, o in rows], pa.string()),
            QUARANTINE_REASON: pa.array(
                ["not JSON" if r in bad else None for r in rows], pa.string()
            ),
        }
    )
    commit_files(
        options,
        batch.schema,
        [write_files(options, iter([batch]))],
        sequence=sequence,
        start={b: lo for b, (lo, _) in ranges.items()},
        end={b: hi for b, (_, hi) in ranges.items()},
    )
    store = StateStore.from_settings(settings)
    store.progress.record(latest_sink_commit(settings.sink, PIPELINE), recorded_by="test")


def test_status_of_a_batch_epoch_half_done(layers: list) -> None:
    settings = layer_settings(*layers)
    plan = decide(settings, decided_by="test-decide")  # the backlog is old: batch
    assert plan.mode == "batch" and plan.boundary == LATEST
    store = StateStore.from_settings(settings)
    commit(settings, plan.epoch, 0, {0: (0, 60), 1: (0, 40)}, bad={(0, 5), (1, 7), (1, 39)})
    store.ledger.record_finished(plan.epoch, [1])
    store.commands.submit("switch_to_stream", {"note": "ops"}, issuer="alice")
    rejected = store.commands.submit("pause", issuer="bob")
    store.commands.reject(rejected, "no: a test")

    status = pipeline_status(settings, origins=setting_origins(*layers), rows=5)
    json.dumps(status)  # JSON-safe throughout

    mode = status["mode"]
    assert (mode["mode"], mode["epoch"], mode["running"]) == ("batch", plan.epoch, True)
    assert mode["reason"] == plan.reason and mode["decided_by"] == "test-decide"
    buckets = {b["bucket"]: b for b in status["buckets"]}
    assert buckets[0] | {"max_event_time": None, "event_time_lag_seconds": None} == {
        "bucket": 0,
        "committed": 60,
        "boundary": 100,
        "latest": 100,
        "offset_lag": 40,
        "max_event_time": None,
        "event_time_lag_seconds": None,
        "finished": False,
    }
    assert buckets[0]["max_event_time"] == (T0 + timedelta(seconds=59)).isoformat()
    assert buckets[1]["finished"] is True and buckets[1]["offset_lag"] == 0
    # The pending switch command decides the next decision, whatever the signals.
    assert status["next"]["mode"] == "stream" and status["next"]["command"]["action"]
    assert [s["strategy"] for s in status["next"]["signals"]][-1] == "combined"
    assert status["thresholds"]["enter_seconds"] == 600
    assert status["thresholds"]["exit_seconds"] == 20
    (epoch,) = status["epochs"]
    assert (epoch["commits"], epoch["records"], epoch["status"]) == (1, 97, "running")
    assert epoch["quarantined"] == 3
    assert epoch["quarantine_reasons"] == [{"reason": "not JSON", "records": 3}]
    assert [c["status"] for c in status["commands"]] == ["rejected", "pending"]
    assert status["commands"][0]["reason"] == "no: a test"
    assert [d["decided_by"] for d in status["decisions"]] == ["test-decide"]
    assert status["settings"]["enter_threshold"] == {"value": "600s", "from": "config file p.toml:"}
    assert status["settings"]["exit_threshold"] == {"value": "20s", "from": "command line:"}
    assert status["settings"]["min_time_in_batch"]["from"] == "default"


def test_status_after_a_switch_shows_the_handoff(layers: list) -> None:
    settings = layer_settings(*layers)
    first = decide(settings).epoch
    commit(settings, first, 0, {0: (0, 100), 1: (0, 40)})
    assert close_epoch(settings, first)[0] == "completed"
    store = StateStore.from_settings(settings)
    second = store.epochs.open("stream", "drained", dict(LATEST))
    status = pipeline_status(settings)
    assert [e["epoch"] for e in status["epochs"]] == [second, first]
    assert status["epochs"][1]["handoff_seconds"] is None  # the first epoch has none before it
    assert status["mode"]["mode"] == "stream" and status["mode"]["running"]
    assert all(b["offset_lag"] == 0 and b["boundary"] is None for b in status["buckets"])


def test_status_says_why_it_cannot_evaluate_and_still_shows_the_rest(layers: list) -> None:
    settings = layer_settings(*layers)
    decide(settings)
    broken = layer_settings(*layers, ("test:", {"source": settings.source + "-gone"}))
    status = pipeline_status(broken)
    assert "gone" in status["next"]["error"]
    assert status["mode"]["mode"] == "batch"
    assert all(b["latest"] is None and b["offset_lag"] is None for b in status["buckets"])


def test_status_of_a_pipeline_that_never_ran_is_refused(layers: list) -> None:
    settings = layer_settings(*layers)
    with pytest.raises(ModeswitchError, match=r"orders.*no epochs or decisions under"):
        pipeline_status(settings)


FIXED = {
    "pipeline": "orders",
    "at": "2026-01-01T12:00:00+00:00",
    "source": "kafka://orders",
    "sink": "s3://lake/orders",
    "mode": {
        "mode": "batch",
        "epoch": 7,
        "running": True,
        "since": "2026-01-01T11:50:00+00:00",
        "reason": "backlog: watermark lag 2h above 10m",
        "decided_by": "airflow scheduled__2026-01-01",
        "ended_at": None,
        "end_reason": None,
    },
    "next": {
        "mode": "batch",
        "switch": False,
        "reason": "backlog not drained",
        "signals": [
            {"strategy": "offset_boundary", "backlog": True, "reason": "1 200 records to go"},
            {"strategy": "combined", "backlog": True, "reason": "offset_boundary"},
        ],
        "watermark": {"lag_seconds": 7200.0},
        "backlog_since": None,
        "dwell_left_seconds": None,
        "min_time_left_seconds": 0.0,
        "command": None,
    },
    "buckets": [
        {
            "bucket": b,
            "committed": c,
            "boundary": 5000,
            "latest": 5100,
            "offset_lag": 5100 - c,
            "max_event_time": "2026-01-01T10:00:00+00:00",
            "event_time_lag_seconds": 7200.0,
            "finished": c == 5000,
        }
        for b, c in ((0, 3800), (1, 5000))
    ],
    "thresholds": {"enter_seconds": 600.0, "exit_seconds": 30.0},
    "epochs": [
        {
            "epoch": 7,
            "mode": "batch",
            "status": "running",
            "started_at": "2026-01-01T11:50:00+00:00",
            "commits": 3,
            "records": 6200,
            "records_per_second": 10.3,
            "handoff_seconds": 4.5,
            "quarantined": 12,
            "quarantine_reasons": [{"reason": "value is not JSON", "records": 12}],
        }
    ],
    "decisions": [
        {
            "at": "2026-01-01T11:50:00+00:00",
            "mode": "batch",
            "switched": True,
            "reason": "backlog: watermark lag 2h above 10m",
            "decided_by": "decide",
        }
    ],
    "commands": [
        {
            "id": 2,
            "kind": "rewind",
            "status": "rejected",
            "issuer": "alice",
            "created_at": "2026-01-01T11:00:00+00:00",
            "applied_epoch": None,
            "reason": "offsets beyond the latest",
        }
    ],
}


def rendered(status: dict, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(render_status(status))
    # Tolerant of widths: compare words, not where the lines break or how wide the cells are.
    return " ".join(out.getvalue().split())


@pytest.mark.parametrize("width", [100, 160])
def test_status_text_is_the_golden_text(width: int) -> None:
    text = rendered(FIXED, width)
    golden = " ".join(GOLDEN.read_text().split())
    assert text == golden, f"render_status changed; if meant, rewrite {GOLDEN}:\n{text}"


def test_status_command_line_refuses_what_it_cannot_use(tmp_path: Path) -> None:
    err = io.StringIO()
    original = cli.errors
    cli.errors = Console(file=err, width=200, color_system=None)
    try:
        assert cli.main(["status"]) == 2
        assert (
            "give --config FILE, --pipeline (and --warehouse), or the pipelines" in err.getvalue()
        )
        assert cli.main(["status", "--pipeline", "x", "--rows", "0"]) == 2
        assert "--rows 0" in err.getvalue()
        warehouse = str(tmp_path / "none")
        assert cli.main(["status", "--pipeline", "x", "--warehouse", warehouse]) == 2
        assert re.search(r"'x': no epochs or decisions under \S+none", err.getvalue())
    finally:
        cli.errors = original


def test_status_command_line_prints_json(layers: list, capsys: pytest.CaptureFixture) -> None:
    settings = layer_settings(*layers)
    decide(settings)
    config = Path(settings.warehouse).parent / "p.json"
    config.write_text(json.dumps(layers[0][1]))
    assert cli.main(["status", "--config", str(config), "--json", "--rows", "1"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["mode"]["mode"] == "batch" and status["pipeline"] == PIPELINE
    assert status["settings"]["enter_threshold"]["from"] == f"config file {config}:"


def test_status_watch_refreshes_until_ctrl_c(layers: list, tmp_path: Path) -> None:
    """A real process (about 2 s: its imports): two refreshes, then SIGINT ends it cleanly."""
    import signal
    import subprocess
    import sys

    settings = layer_settings(*layers)
    decide(settings)
    config = tmp_path / "p.json"
    config.write_text(json.dumps(layers[0][1]))
    command = [sys.executable, "-m", "modeswitch.cli", "status", "--config", str(config)]
    process = subprocess.Popen(
        [*command, "--json", "--watch", "0.2s"], stdout=subprocess.PIPE, text=True
    )
    try:
        first, second = json.loads(process.stdout.readline()), json.loads(process.stdout.readline())
        assert first["pipeline"] == second["pipeline"] == PIPELINE
        assert second["at"] > first["at"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
    finally:
        process.kill()
        process.wait()


def test_a_paused_pipeline_shows_as_paused(layers: list) -> None:
    settings = layer_settings(*layers)
    decide(settings)
    store = StateStore.from_settings(settings)
    # As decide records a pause: the table's mode column holds batch or stream only.
    store.decisions.record("stream", "command #1 pause", {"mode": "paused"}, decided_by="decide")
    status = pipeline_status(settings)
    assert status["mode"]["mode"] == "paused"
    assert status["decisions"][0]["mode"] == "paused"


def test_the_terminal_shows_the_worst_lagging_of_many_buckets(capsys) -> None:
    many = [
        {**FIXED["buckets"][1], "bucket": b, "committed": 5000 - (b % 7), "offset_lag": 100 + b % 7}
        for b in range(1000)
    ]
    summary = {"total": 1000, "lagging": 1000, "offset_lag": sum(b["offset_lag"] for b in many)}
    status = {**FIXED, "buckets": many, "bucket_summary": summary}
    text = rendered(status, 160)
    assert "the 50 worst-lagging of 1,000 (1,000 lagging," in text
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(render_status(status))
    table = out.getvalue().split("worst-lagging", 1)[1].split("epochs, newest first")[0]
    rows = [int(line.split()[0]) for line in table.splitlines() if line.split()[:1] != []
            and line.split()[0].isdigit()]  # fmt: skip
    assert len(rows) == 50 and all(b % 7 == 6 for b in rows)  # the lag of 106, the worst
    assert rows == sorted(rows)
    everything = io.StringIO()
    Console(file=everything, width=160, color_system=None).print(render_status(status, buckets=0))
    assert "worst-lagging" not in everything.getvalue()
