"""What the ``modeswitch`` commands share with the terminal: the output and error consoles,
and :class:`StopFlag`, which turns Ctrl-C or SIGTERM into a clean stop of a long command."""

from __future__ import annotations

import signal
import time

from rich.console import Console

console = Console()
errors = Console(stderr=True)


class StopFlag:
    """Turns SIGINT / SIGTERM into a clean stop at the next flush of a live run."""

    def __init__(self) -> None:
        self.stopped = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._stop)

    def _stop(self, *_: object) -> None:
        self.stopped = True

    def __call__(self) -> bool:
        return self.stopped

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, less if a stop comes; True when stopped."""
        until = time.monotonic() + seconds
        while not self.stopped and time.monotonic() < until:
            time.sleep(min(0.1, max(0.0, until - time.monotonic())))
        return self.stopped
