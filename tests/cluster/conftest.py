"""The cluster tier: a Spark standalone master and two one-core workers on loopback, started
for each test module (:class:`modeswitch.devtools.standalone.StandaloneCluster`) and stopped by
process group after it, however its tests end."""

from __future__ import annotations

import pytest

from modeswitch.devtools.standalone import StandaloneCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=2, cores=1) as running:
        yield running
