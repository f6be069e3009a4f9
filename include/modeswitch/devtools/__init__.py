"""Tools for development, tests, demos and benchmarks: the synthetic producer, the demo,
an Apache Kafka broker and a Spark standalone cluster on loopback. No production module
imports these (``tests/unit/test_layers.py``)."""
