"""Sinks: where processed records land (the Delta sink)."""
