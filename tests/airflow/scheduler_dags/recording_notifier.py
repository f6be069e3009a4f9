"""An Airflow notifier for the scheduler test's lag alerts: appends each alert it is told of,
its template rendered, to the file ``$MODESWITCH_TEST_ALERTS_FILE``. In the DAGs folder, as a
team's own notifiers are (``alert_notifiers = recording_notifier:recorder``)."""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.sdk import BaseNotifier


class RecordingNotifier(BaseNotifier):
    template_fields = ("message",)

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def notify(self, context: dict[str, Any]) -> None:
        with open(os.environ["MODESWITCH_TEST_ALERTS_FILE"], "a") as out:
            out.write(json.dumps({"message": self.message, "run_id": context["run_id"]}) + "\n")


recorder = RecordingNotifier("{{ modeswitch_alert.event }}: {{ modeswitch_alert.reason }}")
