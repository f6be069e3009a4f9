"""Modes: what a Spark job does in each mode. A batch epoch's waves (:mod:`.batch`), a stream
epoch's query (:mod:`.stream`) and where a rerun resumes (:mod:`.resume`), backfills
(:mod:`.backfill`, :mod:`.backfill_job`) and the stream's warm-up (:mod:`.warmup`)."""
