"""modeswitch: drain a backlog with Spark batch, hand off exactly to Structured Streaming."""

from __future__ import annotations

__version__ = "0.1.0"
