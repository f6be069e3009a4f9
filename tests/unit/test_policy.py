"""The switching policy: each strategy, their OR, and the hysteresis of decide_mode, one
scenario at a time, then properties over random load."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pendulum
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modeswitch.control.backlog import (
    Signal,
    combine_signals,
    compute_watermark,
    offset_boundary_signal,
    offset_lag_signal,
    watermark_lag_signal,
)
from modeswitch.control.policy import (
    Decision,
    Observation,
    OperatorCommand,
    PolicyState,
    decide_mode,
)
from modeswitch.control.setting_groups import PolicySettings
from modeswitch.errors import ConfigError, InvalidTimestampError

pytestmark = pytest.mark.unit

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SEC = timedelta(seconds=1)
MIN = timedelta(minutes=1)

SETTINGS = PolicySettings(
    watermark_lag_threshold=5 * MIN,
    offset_lag_threshold=None,
    idle_timeout=MIN,
    enter_threshold=5 * MIN,
    exit_threshold=1 * MIN,
    enter_dwell=1 * MIN,
    min_time_in_stream=3 * MIN,
    min_time_in_batch=0 * MIN,
)


def observe(
    now: datetime,
    lag: timedelta,
    *,
    behind: int = 0,
    boundary: dict[int, int] | None = None,
    committed: int = 1_000,
) -> Observation:
    """Two busy buckets whose watermark lag is ``lag`` (bucket 1 holds it), ``behind``
    unread records in bucket 0."""
    return Observation(
        now=now,
        committed={0: committed, 1: 1_000},
        latest={0: committed + behind, 1: 1_000},
        boundary=boundary,
        max_event_time={0: now - SEC, 1: now - lag},
        last_data_at={0: now, 1: now},
    )


def run(
    lags: list[tuple[timedelta, timedelta]],
    *,
    start: PolicyState | None,
    policy: PolicySettings = SETTINGS,
) -> list[Decision]:
    """Feed ``(elapsed since T0, watermark lag)`` observations through decide_mode, carrying
    the state from one decision to the next as a caller would."""
    decisions = []
    state = start
    for elapsed, lag in lags:
        decision = decide_mode(observe(T0 + elapsed, lag), settings=policy, previous=state)
        decisions.append(decision)
        state = decision.state
    return decisions


STREAMING_SINCE_LONG_AGO = PolicyState(mode="stream", mode_since=T0 - timedelta(hours=1))


# --- strategies ------------------------------------------------------------------------------


def test_offset_boundary_signal():
    assert offset_boundary_signal({0: 5}, None).backlog is None
    behind = offset_boundary_signal({0: 100, 1: 20}, {0: 100, 1: 50, 2: 10})
    assert behind.backlog is True
    assert "2 of 3 buckets below the boundary" in behind.reason
    assert "40 records to go" in behind.reason
    assert "bucket 1 has 30" in behind.reason
    reached = offset_boundary_signal({"0": 100, "1": 50}, {"0": 100, "1": 50})
    assert reached.backlog is False


def test_watermark_lag_above_threshold_is_backlog():
    signal = watermark_lag_signal(
        T0,
        max_event_time={0: T0 - 10 * MIN, 1: T0 - 2 * MIN},
        last_data_at={0: T0, 1: T0},
        threshold=5 * MIN,
        idle_timeout=MIN,
    )
    assert signal.backlog is True
    assert "10m" in signal.reason and "bucket 0" in signal.reason
    below = watermark_lag_signal(
        T0,
        max_event_time={0: T0 - 4 * MIN},
        last_data_at={0: T0},
        threshold=5 * MIN,
        idle_timeout=MIN,
    )
    assert below.backlog is False


def test_watermark_is_min_of_bucket_max_event_times_minus_allowed_lateness():
    watermark = compute_watermark(
        T0,
        max_event_time={0: T0 - 30 * SEC, 1: T0 - 90 * SEC, 2: T0 - 10 * SEC},
        last_data_at={0: T0, 1: T0, 2: T0},
        idle_timeout=MIN,
        allowed_lateness=15 * SEC,
    )
    assert watermark.state == "defined"
    assert watermark.holding_bucket == 1
    assert watermark.value == T0 - 105 * SEC
    assert watermark.lag == 105 * SEC


def test_idle_bucket_does_not_hold_the_watermark_back():
    """Bucket 0 has been quiet for 10 minutes with nothing unread: its old event time must not
    make the source look 1 hour behind."""
    times = {0: T0 - 60 * MIN, 1: T0 - 5 * SEC}
    arrivals = {0: T0 - 10 * MIN, 1: T0}
    signal = watermark_lag_signal(
        T0, max_event_time=times, last_data_at=arrivals, threshold=5 * MIN, idle_timeout=MIN
    )
    assert signal.backlog is False
    watermark = compute_watermark(T0, max_event_time=times, last_data_at=arrivals, idle_timeout=MIN)
    assert watermark.idle_buckets == {0}
    assert watermark.lag == 5 * SEC


def test_quiet_bucket_with_unread_records_is_not_idle():
    """No new data for 10 minutes, but 500 records not read yet: that is backlog, not idle."""
    signal = watermark_lag_signal(
        T0,
        max_event_time={0: T0 - 60 * MIN, 1: T0 - 5 * SEC},
        last_data_at={0: T0 - 10 * MIN, 1: T0},
        threshold=5 * MIN,
        idle_timeout=MIN,
        unread={0: 500},
    )
    assert signal.backlog is True


def test_idle_timeout_none_means_no_bucket_is_ever_idle():
    signal = watermark_lag_signal(
        T0,
        max_event_time={0: T0 - 60 * MIN},
        last_data_at={0: T0 - 50 * MIN},
        threshold=5 * MIN,
        idle_timeout=None,
    )
    assert signal.backlog is True


def test_all_buckets_idle_is_an_idle_source_not_backlog():
    signal = watermark_lag_signal(
        T0,
        max_event_time={0: T0 - 60 * MIN, 1: T0 - 90 * MIN},
        last_data_at={0: T0 - 5 * MIN, 1: T0 - 5 * MIN},
        threshold=5 * MIN,
        idle_timeout=MIN,
    )
    assert signal.backlog is False
    assert "idle" in signal.reason


def test_busy_bucket_with_nothing_committed_makes_the_watermark_undefined_and_backlog():
    watermark = compute_watermark(
        T0,
        max_event_time={1: T0},
        last_data_at={0: T0, 1: T0},
        idle_timeout=MIN,
        unread={0: 10_000},
    )
    assert watermark.state == "undefined"
    assert watermark.holding_bucket == 0
    assert watermark.lag_above(timedelta(days=365))
    signal = watermark_lag_signal(
        T0,
        max_event_time={1: T0},
        last_data_at={0: T0, 1: T0},
        threshold=5 * MIN,
        idle_timeout=MIN,
        unread={0: 10_000},
    )
    assert signal.backlog is True


def test_watermark_threshold_none_turns_the_strategy_off():
    signal = watermark_lag_signal(
        T0,
        max_event_time={0: T0 - 60 * MIN},
        last_data_at={0: T0},
        threshold=None,
        idle_timeout=MIN,
    )
    assert signal.backlog is None
    assert "off" in signal.reason


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(seconds=-5), "0s", 0])
def test_watermark_threshold_zero_or_negative_is_a_clear_error(bad):
    with pytest.raises(ConfigError, match="watermark_lag_threshold"):
        watermark_lag_signal(
            T0, max_event_time={}, last_data_at={}, threshold=bad, idle_timeout=MIN
        )


def test_offset_lag_total_and_worst_bucket():
    committed, latest = {0: 100, 1: 100, 2: 100}, {0: 400, 1: 400, 2: 150}
    total = offset_lag_signal(committed, latest, threshold=500, measure="total")
    assert total.backlog is True and "650 records behind in total" in total.reason
    worst = offset_lag_signal(committed, latest, threshold=500, measure="max_bucket")
    assert worst.backlog is False and "300 records behind in bucket 0" in worst.reason
    assert offset_lag_signal(committed, latest, threshold=None).backlog is None


@pytest.mark.parametrize("bad", [0, -1])
def test_offset_lag_threshold_zero_or_negative_is_a_clear_error(bad):
    with pytest.raises(ConfigError, match=f"offset_lag_threshold: {bad}"):
        offset_lag_signal({0: 0}, {0: 10}, threshold=bad)


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ((None, None, None), None),
        ((None, False, None), False),
        ((False, False, False), False),
        ((False, True, False), True),
        ((None, None, True), True),
        ((True, True, False), True),
    ],
)
def test_strategies_combine_with_or(verdicts, expected):
    signals = [Signal(f"s{i}", v, f"reason {i}") for i, v in enumerate(verdicts)]
    combined = combine_signals(signals)
    assert combined.backlog is expected
    for i, verdict in enumerate(verdicts):
        if verdict is True:
            assert f"s{i}: reason {i}" in combined.reason


# --- decide_mode: scenarios ------------------------------------------------------------------


def test_first_decision_with_a_backlog_starts_in_batch_without_dwell():
    decision = decide_mode(observe(T0, 2 * 60 * MIN), settings=SETTINGS)
    assert decision.mode == "batch"
    assert decision.switched
    assert decision.state == PolicyState("batch", T0, backlog_since=T0)


def test_first_decision_without_backlog_starts_in_stream():
    decision = decide_mode(observe(T0, 10 * SEC), settings=SETTINGS)
    assert decision.mode == "stream"
    assert decision.state == PolicyState("stream", T0, backlog_since=None)


def test_sustained_lag_switches_to_batch_once_the_dwell_has_passed():
    lags = [(k * 15 * SEC, 10 * MIN) for k in range(6)]  # 0s .. 75s
    decisions = run(lags, start=STREAMING_SINCE_LONG_AGO)
    modes = [d.mode for d in decisions]
    assert modes == ["stream", "stream", "stream", "stream", "batch", "batch"]
    assert "less than enter_dwell" in decisions[2].reason
    assert decisions[4].switched and "held for 60s" in decisions[4].reason
    assert decisions[4].state.mode_since == T0 + 60 * SEC


def test_lag_spike_shorter_than_the_dwell_never_switches():
    lags = [(0 * SEC, 10 * SEC), (10 * SEC, 20 * MIN), (40 * SEC, 20 * MIN), (50 * SEC, 30 * SEC)]
    lags += [(k * 10 * SEC, 10 * SEC) for k in range(6, 30)]
    decisions = run(lags, start=STREAMING_SINCE_LONG_AGO)
    assert {d.mode for d in decisions} == {"stream"}
    assert decisions[2].state.backlog_since == T0 + 10 * SEC
    assert decisions[3].state.backlog_since is None, "the spike ended: the dwell starts over"


def test_flapping_load_shorter_than_the_dwell_never_switches():
    """Lag alternates between 10 minutes and 10 seconds every 30 s for an hour."""
    lags = [(k * 30 * SEC, 10 * MIN if k % 2 == 0 else 10 * SEC) for k in range(120)]
    decisions = run(lags, start=STREAMING_SINCE_LONG_AGO)
    assert {d.mode for d in decisions} == {"stream"}


def test_backlog_signal_with_lag_below_enter_threshold_does_not_switch():
    """Offset lag says backlog, but events are fresh: lag 2 minutes < enter_threshold 5m."""
    policy = PolicySettings(
        watermark_lag_threshold=MIN,
        offset_lag_threshold=1_000,
        enter_threshold=5 * MIN,
        exit_threshold=MIN,
        enter_dwell=MIN,
        min_time_in_stream=0 * MIN,
    )
    state = STREAMING_SINCE_LONG_AGO
    for k in range(10):
        decision = decide_mode(
            observe(T0 + k * MIN, 2 * MIN, behind=50_000), settings=policy, previous=state
        )
        state = decision.state
        assert decision.combined.backlog is True
        assert decision.mode == "stream"
    assert "not above enter_threshold" in decision.reason


def test_without_enter_threshold_offset_lag_alone_switches():
    policy = PolicySettings(
        watermark_lag_threshold=None,
        offset_lag_threshold=1_000,
        enter_threshold=None,
        exit_threshold=None,
        enter_dwell=MIN,
        min_time_in_stream=0 * MIN,
    )
    state = STREAMING_SINCE_LONG_AGO
    modes = []
    for k in range(3):
        decision = decide_mode(
            observe(T0 + k * MIN, 0 * MIN, behind=50_000), settings=policy, previous=state
        )
        state = decision.state
        modes.append(decision.mode)
    assert modes == ["stream", "batch", "batch"]
    assert "offset_lag: 50000 records behind in total" in decision.reason


def test_minimum_time_in_stream_holds_back_a_switch():
    just_switched = PolicyState("stream", mode_since=T0, backlog_since=None)
    lags = [(k * 30 * SEC, 30 * MIN) for k in range(8)]  # 0s .. 210s
    decisions = run(lags, start=just_switched)
    modes = [d.mode for d in decisions]
    assert modes == ["stream"] * 6 + ["batch"] * 2  # switches at 180s = min_time_in_stream
    assert "min_time_in_stream" in decisions[4].reason


def test_batch_stays_until_the_boundary_is_reached():
    in_batch = PolicyState("batch", mode_since=T0 - 10 * MIN, backlog_since=T0 - 11 * MIN)
    decision = decide_mode(
        observe(T0, 10 * SEC, committed=900, boundary={0: 1_000, 1: 1_000}),
        settings=SETTINGS,
        previous=in_batch,
    )
    assert decision.mode == "batch"
    assert "backlog not drained" in decision.reason
    assert "bucket 0 has 100" in decision.reason


def test_batch_switches_to_stream_when_drained_and_lag_at_most_exit():
    in_batch = PolicyState("batch", mode_since=T0 - 10 * MIN, backlog_since=T0 - 11 * MIN)
    decision = decide_mode(
        observe(T0, 30 * SEC, boundary={0: 1_000, 1: 1_000}),
        settings=SETTINGS,
        previous=in_batch,
    )
    assert decision.mode == "stream"
    assert decision.switched
    assert decision.state == PolicyState("stream", T0, backlog_since=None)


def test_drained_but_lag_between_exit_and_enter_stays_in_batch():
    """Hysteresis band: lag 3 minutes is not backlog (threshold 5m) but above exit (1m)."""
    in_batch = PolicyState("batch", mode_since=T0 - 10 * MIN)
    decision = decide_mode(
        observe(T0, 3 * MIN, boundary={0: 1_000, 1: 1_000}),
        settings=SETTINGS,
        previous=in_batch,
    )
    assert decision.combined.backlog is False
    assert decision.mode == "batch"
    assert "above exit_threshold 60s" in decision.reason


def test_minimum_time_in_batch_holds_back_a_switch():
    policy = PolicySettings(**{**SETTINGS.__dict__, "min_time_in_batch": 10 * MIN})
    in_batch = PolicyState("batch", mode_since=T0 - 4 * MIN)
    drained = observe(T0, 0 * SEC, boundary={0: 1_000, 1: 1_000})
    assert decide_mode(drained, settings=policy, previous=in_batch).mode == "batch"
    later = observe(T0 + 6 * MIN, 0 * SEC, boundary={0: 1_000, 1: 1_000})
    assert decide_mode(later, settings=policy, previous=in_batch).mode == "stream"


def test_operator_commands_override_and_record_the_reason():
    backlog = observe(T0, 60 * MIN)
    calm = observe(T0, 5 * SEC)

    forced = decide_mode(
        calm,
        settings=SETTINGS,
        previous=STREAMING_SINCE_LONG_AGO,
        command=OperatorCommand("force_batch", note="alice: reprocess after schema fix"),
    )
    assert forced.mode == "batch" and forced.switched
    assert "operator command force_batch (alice: reprocess after schema fix)" in forced.reason

    held = decide_mode(
        backlog,
        settings=SETTINGS,
        previous=PolicyState("stream", mode_since=T0),  # min time in stream not reached
        command=OperatorCommand("force_stream"),
    )
    assert held.mode == "stream"
    assert "operator command force_stream overrides" in held.reason
    assert "signals: backlog" in held.reason

    paused = decide_mode(
        backlog, settings=SETTINGS, previous=forced.state, command=OperatorCommand("pause")
    )
    assert paused.mode == "paused"

    # Paused until a resume comes, whatever the signals.
    held = decide_mode(observe(T0 + MIN, 60 * MIN), settings=SETTINGS, previous=paused.state)
    assert (held.mode, held.switched) == ("paused", False)
    assert held.reason == "paused by an operator's command until a resume"

    resumed = decide_mode(
        observe(T0 + MIN, 60 * MIN),
        settings=SETTINGS,
        previous=held.state,
        command=OperatorCommand("resume", "#9"),
    )
    assert resumed.mode == "batch"
    assert "resumed after pause (#9)" in resumed.reason
    # A resume with nothing paused leaves the policy to decide as it would.
    running = decide_mode(
        observe(T0 + MIN, 60 * MIN),
        settings=SETTINGS,
        previous=resumed.state,
        command=OperatorCommand("resume"),
    )
    assert running.mode == "batch" and "backlog" in running.reason


def test_unknown_command_is_refused():
    with pytest.raises(ConfigError, match="'rewind'"):
        OperatorCommand("rewind")  # type: ignore[arg-type]


def test_naive_datetimes_are_refused():
    naive = datetime(2026, 3, 1, 12, 0)  # naive on purpose
    with pytest.raises(InvalidTimestampError, match="now"):
        Observation(now=naive, committed={}, latest={})
    with pytest.raises(InvalidTimestampError, match="max_event_time of bucket 3"):
        Observation(now=T0, committed={}, latest={}, max_event_time={3: naive})
    with pytest.raises(InvalidTimestampError, match="mode_since"):
        PolicyState("stream", mode_since=naive)


def test_pendulum_datetimes_are_accepted():
    now = pendulum.datetime(2026, 3, 1, 12, tz="UTC")
    decision = decide_mode(
        Observation(
            now=now,
            committed={0: 5},
            latest={0: 5},
            max_event_time={0: now.subtract(hours=1)},
            last_data_at={0: now.subtract(seconds=5)},
        ),
        settings=SETTINGS,
    )
    assert decision.mode == "batch"


def test_decision_is_pure_and_records_its_inputs():
    obs = observe(T0, 10 * MIN, behind=7, boundary={0: 2_000, 1: 1_000})
    one = decide_mode(obs, settings=SETTINGS, previous=STREAMING_SINCE_LONG_AGO)
    two = decide_mode(obs, settings=SETTINGS, previous=STREAMING_SINCE_LONG_AGO)
    assert one == two
    record = json.loads(json.dumps(one.to_record()))
    assert record["observation"]["committed"] == {"0": 1_000, "1": 1_000}
    assert record["observation"]["boundary"] == {"0": 2_000, "1": 1_000}
    assert record["previous"]["mode"] == "stream"
    assert record["state"]["backlog_since"] == T0.isoformat()
    assert record["watermark"]["lag_seconds"] == 600.0
    assert [s["strategy"] for s in record["signals"]] == [
        "offset_boundary",
        "watermark_lag",
        "offset_lag",
        "combined",
    ]


# --- properties ------------------------------------------------------------------------------

steps = st.lists(
    st.tuples(
        st.integers(1, 90),  # seconds since the previous observation
        st.integers(0, 15 * 60),  # watermark lag, seconds
        st.integers(0, 20_000),  # unread records
    ),
    min_size=1,
    max_size=60,
)
PROPERTY_SETTINGS = PolicySettings(
    watermark_lag_threshold=5 * MIN,
    offset_lag_threshold=5_000,
    enter_threshold=4 * MIN,
    exit_threshold=1 * MIN,
    enter_dwell=1 * MIN,
    min_time_in_stream=3 * MIN,
    min_time_in_batch=2 * MIN,
    idle_timeout=None,
)


@settings(max_examples=150, deadline=None)
@given(steps=steps, start_mode=st.sampled_from(["stream", "batch"]))
def test_property_decisions_never_flap_faster_than_the_minimum_dwell(steps, start_mode):
    policy = PROPERTY_SETTINGS
    minimum = {"stream": policy.min_time_in_stream, "batch": policy.min_time_in_batch}
    state = PolicyState(start_mode, mode_since=T0)
    now = T0
    entered = {"mode": start_mode, "at": T0}
    condition_since: datetime | None = None
    for seconds, lag, behind in steps:
        now += timedelta(seconds=seconds)
        decision = decide_mode(
            observe(now, timedelta(seconds=lag), behind=behind), settings=policy, previous=state
        )
        entering = decision.combined.backlog is True and decision.watermark.lag_above(
            policy.enter_threshold
        )
        condition_since = (condition_since or now) if entering else None
        if decision.mode != state.mode:
            assert now - entered["at"] >= minimum[state.mode], "left a mode too soon"
            if decision.mode == "batch":
                assert condition_since is not None
                assert now - condition_since >= policy.enter_dwell, "entered batch before dwell"
            else:
                assert decision.combined.backlog is not True, "left batch with a backlog"
                assert decision.watermark.lag_at_most(policy.exit_threshold)
            entered = {"mode": decision.mode, "at": now}
        state = decision.state


verdicts = st.lists(st.sampled_from([True, False, None]), min_size=0, max_size=6)


@settings(max_examples=100, deadline=None)
@given(verdicts=verdicts)
def test_property_or_semantics(verdicts):
    combined = combine_signals(Signal(f"s{i}", v, "") for i, v in enumerate(verdicts))
    if True in verdicts:
        assert combined.backlog is True
    elif False in verdicts:
        assert combined.backlog is False
    else:
        assert combined.backlog is None


@settings(max_examples=100, deadline=None)
@given(
    lag=st.integers(0, 3_600),
    behind=st.integers(0, 20_000),
    below_boundary=st.integers(0, 1_000),
)
def test_property_decide_mode_is_the_or_of_the_strategies(lag, behind, below_boundary):
    """Without hysteresis gates, a first decision is batch exactly when some strategy says
    backlog."""
    policy = PolicySettings(
        watermark_lag_threshold=5 * MIN,
        offset_lag_threshold=5_000,
        enter_threshold=None,
        exit_threshold=None,
        idle_timeout=None,
    )
    obs = observe(
        T0,
        timedelta(seconds=lag),
        behind=behind,
        boundary={0: 1_000 + below_boundary, 1: 1_000},
    )
    decision = decide_mode(obs, settings=policy)
    any_backlog = lag > 300 or behind > 5_000 or below_boundary > 0
    assert decision.mode == ("batch" if any_backlog else "stream")
