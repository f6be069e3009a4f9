"""Test tiers: every test is marked by the folder it lives in (unit, spark, airflow, ...)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

# No per-example deadline: on this 2-core machine a property test's examples are slowed by
# whatever else runs (a Spark job), and Hypothesis's default 200 ms deadline then fails a
# correct test (seen: a plan of 12 000 one-record partitions while an end-to-end test ran).
settings.register_profile("modeswitch", deadline=None)
settings.load_profile("modeswitch")

TIERS = ("unit", "spark", "airflow", "e2e", "faults", "browser", "kafka", "cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
