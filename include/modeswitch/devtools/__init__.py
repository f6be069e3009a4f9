"""Tools for development, tests, demos and benchmarks: the synthetic producer, the demo,
librdkafka's mock cluster and a loopback Spark standalone cluster. No production module
imports these (``tests/unit/test_layers.py``)."""
