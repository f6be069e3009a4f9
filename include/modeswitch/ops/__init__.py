"""Operations: what an operator asks of a pipeline. Its status (:mod:`.status`), the
exactly-once audit (:mod:`.verify`) and table maintenance (:mod:`.maintenance`)."""
