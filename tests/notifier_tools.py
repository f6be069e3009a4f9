"""An Airflow notifier for tests of the lag alerts: it keeps each message it was called with,
its template rendered from the context the task hands it, as Airflow's own notifiers render
theirs."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseNotifier


class RecordingNotifier(BaseNotifier):
    template_fields = ("message",)

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message
        self.sent: list[str] = []

    def notify(self, context: dict[str, Any]) -> None:
        self.sent.append(self.message)
