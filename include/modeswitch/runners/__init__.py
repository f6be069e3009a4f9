"""Runners: how an epoch runs. The epoch lifecycle (:mod:`.lifecycle`: decide, run, close),
the job entrypoints' shared code (:mod:`.jobs`), the Spark session and its JVM
(:mod:`.session`, :mod:`.jvm`), child processes (:mod:`.processes`), the local runner and the
warm engine."""
