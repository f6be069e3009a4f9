"""Source logs (the embedded segment log, Kafka) and the ``bucketlog`` Spark data source."""
