"""The jars `make install` fetched from jvm/pom.xml (delta-spark, Spark's Kafka connector) add to
pyspark's and never replace one.

Two versions of one artifact on Spark's class path load whichever comes first (Delta's POM
asks for other versions of Jackson, Parquet, Hadoop's client, Scala, ...: delta-io/delta#7415);
jvm/pom.xml excludes them. A new dependency of a newer Delta, or a pom edit, that brings one
back fails here, naming the jar and pyspark's."""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest

from modeswitch.errors import ModeswitchError
from modeswitch.runners.jvm import fetched_jars
from modeswitch.runners.session import _require_jars, spark_jars

PYSPARK_JARS = Path(pyspark.__file__).parent / "jars"


def artifact(jar: str) -> str:
    """A jar's artifact name: its file name up to the version (and classifier)."""
    stem = Path(jar).name.removesuffix(".jar")
    found = re.match(r"(.+?)-\d", stem)
    return found.group(1) if found else stem


def test_artifact_names_drop_the_version_and_classifier() -> None:
    assert artifact("jackson-databind-2.13.5.jar") == "jackson-databind"
    assert artifact("delta-spark_4.2_2.13-4.4.0.jar") == "delta-spark_4.2_2.13"
    assert artifact("hive-exec-2.3.10-core.jar") == "hive-exec"
    assert artifact("netty-transport-native-epoll-4.2.13.Final-linux-x86_64.jar") == (
        "netty-transport-native-epoll"
    )


def test_no_fetched_jar_is_an_artifact_pyspark_ships() -> None:
    shipped = {artifact(jar.name): jar.name for jar in PYSPARK_JARS.glob("*.jar")}
    assert shipped, f"no jars in {PYSPARK_JARS}"
    twice = {
        Path(jar).name: shipped[artifact(jar)] for jar in fetched_jars() if artifact(jar) in shipped
    }
    assert twice == {}, f"fetched jar -> pyspark's copy (exclude it in jvm/pom.xml): {twice}"


def test_the_fetched_delta_is_built_for_pysparks_spark_and_scala() -> None:
    spark = ".".join(pyspark.__version__.split(".")[:2])
    scala = artifact(next(PYSPARK_JARS.glob("spark-core_*.jar")).name).removeprefix("spark-core_")
    names = {artifact(jar) for jar in fetched_jars()}
    assert {f"delta-spark_{spark}_{scala}", "delta-storage"} <= names


def test_sparks_kafka_connector_is_pysparks_release_and_the_broker_is_not_on_sparks_path() -> None:
    scala = artifact(next(PYSPARK_JARS.glob("spark-core_*.jar")).name).removeprefix("spark-core_")
    names = {Path(jar).name for jar in fetched_jars()}
    assert f"spark-sql-kafka-0-10_{scala}-{pyspark.__version__}.jar" in names
    assert f"spark-token-provider-kafka-0-10_{scala}-{pyspark.__version__}.jar" in names
    # The broker's jars (jvm/kafka-broker/pom.xml) live apart: one kafka-clients, Spark's.
    assert {artifact(n) for n in names if n.startswith("kafka")} == {"kafka-clients"}
    assert len([n for n in names if n.startswith("kafka-clients-")]) == 1


def test_a_deployments_own_jars_come_first_and_each_jar_once() -> None:
    ours = fetched_jars()
    assert spark_jars(None) == ",".join(ours)
    assert spark_jars(f"/opt/kafka.jar, {ours[0]}") == ",".join(["/opt/kafka.jar", *ours])


class _Submitted:
    """A session spark-submit started, as far as its ``spark.jars`` goes."""

    def __init__(self, jars: str) -> None:
        self.sparkContext = self
        self.jars = jars

    def getConf(self) -> dict[str, str]:
        return {"spark.jars": self.jars}


def test_a_submitted_session_without_the_fetched_jars_is_refused() -> None:
    # spark-submit hands the jars on as file: URIs.
    _require_jars(_Submitted(",".join(f"file:{jar}" for jar in fetched_jars())))
    with pytest.raises(ModeswitchError, match=r'delta-storage-.*missing.*--jars "\$\(modeswitch'):
        _require_jars(_Submitted(",".join(j for j in fetched_jars() if "storage" not in j)))
