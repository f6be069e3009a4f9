"""Test tiers: every test is marked by the folder it lives in (unit, spark, airflow, ...)."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "spark", "airflow", "e2e", "faults", "browser")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
