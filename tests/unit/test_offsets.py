"""Offsets maps and their JSON form."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modeswitch.errors import InvalidOffsetsError
from modeswitch.offsets import (
    offsets_from_dict,
    offsets_from_json,
    offsets_to_dict,
    offsets_to_json,
)


def test_json_uses_string_keys_in_numeric_bucket_order() -> None:
    assert offsets_to_json({10: 5, 2: 7, 0: 1}) == '{"0":1,"2":7,"10":5}'
    assert offsets_to_dict({1: 3}) == {"1": 3}


def test_parsing_accepts_string_and_int_keys() -> None:
    assert offsets_from_json('{"0": 120, "1": 98}') == {0: 120, 1: 98}
    assert offsets_from_dict({0: 1, "3": "4"}) == {0: 1, 3: 4}


@given(st.dictionaries(st.integers(0, 10_000), st.integers(0, 2**62), max_size=50))
def test_json_round_trip(offsets: dict[int, int]) -> None:
    assert offsets_from_json(offsets_to_json(offsets)) == offsets


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"a": 1}', "bucket 'a' is not an integer"),
        ('{"0": "x"}', "offset of bucket 0 'x' is not an integer"),
        ('{"0": 1.5}', "is not an integer"),
        ('{"0": true}', "is not an integer"),
        ('{"0": -3}', "offset -3 of bucket 0 is negative"),
        ('{"-1": 3}', "bucket -1 is negative"),
    ],
)
def test_malformed_maps_are_refused_naming_the_source(text: str, reason: str) -> None:
    with pytest.raises(InvalidOffsetsError) as err:
        offsets_from_json(text, source="option startingOffsets")
    assert str(err.value).startswith("option startingOffsets")
    assert reason in str(err.value)
