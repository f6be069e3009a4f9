"""Control: the pipeline's settings and its pure decisions (the backlog policy, the planner).

No Spark, no Airflow and no table I/O in the decisions: :mod:`.policy` and :mod:`.planning`
are functions of plain values, tested one scenario at a time."""
