"""A partition without a leader (a topic just created, a leader moving) is asked again within
the offsets request's time; an unreachable broker is not. A stand-in metadata client answers:
the broker's part is the error code, which these tests choose."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from modeswitch.errors import ModeswitchError
from modeswitch.sources import kafka_topic
from modeswitch.sources.kafka import KafkaLog


class Answers:
    """``get_watermark_offsets`` fails with each of ``errors`` in turn, then answers."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.asked = 0

    def get_watermark_offsets(self, tp, timeout: float) -> tuple[int, int]:
        self.asked += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return (0, 100)

    def close(self) -> None:
        pass


def _log(answers: Answers) -> KafkaLog:
    log = KafkaLog("kafka://t", config={"bootstrap.servers": "127.0.0.1:1"})
    log._consumer = answers
    return log


def test_a_partition_between_leaders_is_asked_again() -> None:
    answers = Answers(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)
    assert _log(answers)._watermark(0) == (0, 100)
    assert answers.asked == 3


def test_a_partition_that_stays_without_a_leader_fails_within_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kafka_topic, "METADATA_TIMEOUT", 1.0)
    answers = Answers(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 100)
    with pytest.raises(ModeswitchError, match=r"offsets of partition 0 .* Not leader"):
        _log(answers)._watermark(0)
    assert 2 <= answers.asked <= 6


def test_an_unreachable_broker_is_not_asked_again() -> None:
    answers = Answers(KafkaError._TRANSPORT)
    with pytest.raises(ModeswitchError, match="is the broker reachable"):
        _log(answers)._watermark(0)
    assert answers.asked == 1
