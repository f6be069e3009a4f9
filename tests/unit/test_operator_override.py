"""What overrides the policy at ``decide``: pending commands and the force_mode run param, one
scenario per test (a pure function: no tables, no Spark)."""

from __future__ import annotations

from modeswitch.control.policy import OperatorCommand
from modeswitch.runners.lifecycle import operator_override


def test_no_command_and_auto_leave_the_choice_to_the_policy() -> None:
    assert operator_override([], "auto") == (None, [])


def test_a_pending_switch_decides_and_is_applied() -> None:
    assert operator_override([(4, "switch_to_batch")]) == (
        OperatorCommand("force_batch", "#4"),
        [4],
    )


def test_the_newest_of_several_switches_decides_and_all_are_applied() -> None:
    command, applied = operator_override([(4, "switch_to_batch"), (5, "switch_to_stream")])
    assert command == OperatorCommand("force_stream", "#5")
    assert applied == [4, 5]


def test_a_pause_decides_and_a_later_resume_lifts_it() -> None:
    assert operator_override([(2, "pause")]) == (OperatorCommand("pause", "#2"), [2])
    command, applied = operator_override([(2, "pause"), (3, "resume")])
    assert command == OperatorCommand("resume", "#3")  # the newest: paused, then running
    assert applied == [2, 3]
    assert operator_override([(3, "resume")]) == (OperatorCommand("resume", "#3"), [3])


def test_a_command_the_stream_applied_at_its_stop_decides_unless_a_newer_one_is_pending() -> None:
    carried = OperatorCommand("force_batch", "#5, which stopped the stream")
    assert operator_override([], carried=carried) == (carried, [])
    command, applied = operator_override([(6, "switch_to_stream")], carried=carried)
    assert command == OperatorCommand("force_stream", "#6") and applied == [6]


def test_a_rewind_is_not_decides_business() -> None:
    assert operator_override([(6, "rewind")]) == (None, [])


def test_force_mode_wins_over_commands_which_are_still_applied() -> None:
    command, applied = operator_override([(7, "switch_to_batch")], "stream")
    assert command == OperatorCommand("force_stream", "run param force_mode")
    assert applied == [7]
    assert operator_override([], "batch") == (
        OperatorCommand("force_batch", "run param force_mode"),
        [],
    )
