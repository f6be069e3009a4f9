# One image for every modeswitch container of docker-compose.yaml: Airflow's official image
# (Python 3.11) with Java 17 and the pinned stack. The Spark master and workers run pip's
# pyspark (its bin/spark-class) from this same image, so the driver (in the Airflow scheduler:
# LocalExecutor, client deploy mode) and the executors run the same Spark and the same Python:
# PySpark refuses Python workers of another minor version, and a standalone cluster must run
# the driver's Spark version.
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.11
ARG MAVEN_IMAGE=maven:3.9-eclipse-temurin-17

# The JVM artifacts of jvm/pom.xml (delta-spark and what pyspark lacks), fetched as `make
# install` fetches them; every Spark session of ours puts exactly these on spark.jars.
FROM ${MAVEN_IMAGE} AS jars
COPY jvm/pom.xml /build/pom.xml
RUN mvn -B -q -f /build/pom.xml dependency:copy-dependencies -DoutputDirectory=/build/jars

FROM ${AIRFLOW_IMAGE}

USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps curl \
    && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/java-17 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /data /opt/modeswitch \
    && chown -R airflow:root /data /opt/modeswitch
ENV JAVA_HOME=/usr/lib/jvm/java-17

USER airflow
WORKDIR /opt/modeswitch
# The stack first (its layer is reused while only the code changes); Airflow stays the base
# image's version (the same pin).
COPY --chown=airflow:root requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt
# The package in place (editable): the jobs' entrypoints are found beside it, in jobs/.
COPY --chown=airflow:root pyproject.toml README.md ./
COPY --chown=airflow:root include ./include
COPY --chown=airflow:root jobs ./jobs
COPY --chown=airflow:root dags ./dags
COPY --chown=airflow:root plugins ./plugins
COPY --from=jars --chown=airflow:root /build/jars ./.jars
RUN pip install --no-cache-dir --no-deps -e .
