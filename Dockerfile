# One image for every modeswitch container of docker-compose.yaml: the Airflow components, the
# Spark master and workers, and the warm engine. Debian 12 with its Python 3.11 and Java 17, the
# pinned stack in a virtualenv, the package installed in place. The Spark master and workers run
# pip's pyspark (its bin/spark-class) from this same image, so the driver (in the Airflow
# scheduler: LocalExecutor, client deploy mode) and the executors run the same Spark and the
# same Python: PySpark refuses Python workers of another minor version, and a standalone
# cluster must run the driver's Spark version.
#
# Build with BuildKit and pip's CA bundle as the secret `ca` (tools/compose/build does both):
#   DOCKER_BUILDKIT=1 docker build --secret id=ca,src=/path/to/ca.crt -t modeswitch .
# BASE is a Debian 12 image: tools/compose/base-image makes modeswitch-base:bookworm locally;
# where a registry is reachable, --build-arg BASE=debian:bookworm-slim is the same thing.
# The JVM jars come from the context's .jars/ (`make jars` fetches them from jvm/pom.xml).
#
# Runs as modeswitch (uid 50000, gid 0: --build-arg MODESWITCH_UID for another uid), who owns
# AIRFLOW_HOME (/opt/airflow), /data and its home; the code and the virtualenv are root's,
# read-only to it.
ARG BASE=modeswitch-base:bookworm
FROM ${BASE} AS drivers
# Airflow's PostgreSQL drivers (sync and async, as its postgres extra has them), at the pins of
# requirements-dev.txt: only those two lines go on, so a change elsewhere in that file does not
# invalidate the stack's layer below.
COPY requirements-dev.txt /tmp/
RUN grep -E '^(psycopg2-binary|asyncpg)==' /tmp/requirements-dev.txt >/tmp/drivers.txt \
    && test "$(wc -l </tmp/drivers.txt)" = 2 \
    || { echo "requirements-dev.txt pins no psycopg2-binary==X and asyncpg==Y" >&2; exit 1; }

FROM ${BASE}

ARG DEBIAN_FRONTEND=noninteractive
# Java's postinst links its man pages, which the slim base leaves out: the folder must exist.
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends \
        python3 python3-venv openjdk-17-jre-headless procps curl tini ca-certificates; \
    ln -s "$(dirname "$(dirname "$(readlink -f /usr/bin/java)")")" /usr/lib/jvm/java-17; \
    rm -rf /var/lib/apt/lists/*

ENV JAVA_HOME=/usr/lib/jvm/java-17 \
    VIRTUAL_ENV=/opt/modeswitch/.venv \
    PATH=/opt/modeswitch/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    MODESWITCH_JARS=/opt/modeswitch/.jars \
    AIRFLOW_HOME=/opt/airflow \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/modeswitch
# The stack first: its layer is reused while only the code, the jars or the dev pins change.
# As `make install` installs it (requirements.txt, no constraints file), plus the drivers.
# pip's cache is a build cache (never in the image); the CA bundle a secret, mounted for pip only.
# --use-pep517: pyspark and pyspark-client are sdists only; they are built into wheels (and
# cached) as pip does in the host's virtualenv, not `setup.py install`ed as the pip of Debian's
# python3-venv would.
COPY requirements.txt ./
COPY --from=drivers /tmp/drivers.txt ./
RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    set -eu; \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    python3 -m venv .venv; \
    .venv/bin/pip install --disable-pip-version-check --progress-bar off \
        --use-pep517 -r requirements.txt -r drivers.txt; \
    AIRFLOW_HOME=/tmp/airflow-check .venv/bin/python -c 'import pyspark, airflow, deltalake, pyarrow, psycopg2, asyncpg'; \
    rm -rf /tmp/airflow-check; \
    test -x .venv/bin/spark-submit && test -x .venv/bin/spark-class

# The JVM artifacts of jvm/pom.xml (delta-spark and what pyspark lacks): every Spark session of
# ours puts exactly these on spark.jars ($MODESWITCH_JARS).
COPY .jars ./.jars

# The package in place (editable): the jobs' entrypoints are found beside it, in jobs/
# (runners/jobs.py: Path(__file__).parents[3] / "jobs"). Its build backend (setuptools, from
# pyproject.toml) comes from PyPI, hence the secret again. Compiled here: the runtime user
# cannot write __pycache__ beside the sources.
COPY pyproject.toml README.md ./
COPY include ./include
COPY jobs ./jobs
COPY dags ./dags
COPY plugins ./plugins
RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    set -eu; \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    .venv/bin/pip install --disable-pip-version-check --progress-bar off --no-deps -e .; \
    .venv/bin/python -m compileall -q include jobs dags plugins; \
    AIRFLOW_HOME=/tmp/airflow-check .venv/bin/python -c 'import modeswitch.cli, modeswitch.runners.jobs as j; assert j.JOBS.is_dir(), j.JOBS'; \
    rm -rf /tmp/airflow-check

# The runtime user, last (a new uid rebuilds only this layer). Spark needs its uid to have a
# passwd entry (Hadoop's login fails with "Invalid UID" otherwise), so docker-compose.yaml's
# AIRFLOW_UID must be this uid: build with --build-arg MODESWITCH_UID=$AIRFLOW_UID for another.
# Its home holds ~/.cache/modeswitch (MODESWITCH_CACHE, MODESWITCH_ENGINE_DIR); HOME is set only
# now, so that pip above keeps root's cache. AIRFLOW_HOME is made here, empty but for logs/ (the
# checks above import Airflow with a throwaway AIRFLOW_HOME: Airflow makes logs/ on import, and
# a root-owned one breaks the dag-processor).
ARG MODESWITCH_UID=50000
RUN set -eux; \
    useradd --uid "$MODESWITCH_UID" --gid 0 --home-dir /home/modeswitch --create-home --shell /bin/bash modeswitch; \
    rm -rf /opt/airflow; \
    mkdir -p /opt/airflow/logs /data; \
    chown -R modeswitch:0 /opt/airflow /data /home/modeswitch; \
    chmod 2775 /opt/airflow /opt/airflow/logs /data /home/modeswitch
ENV HOME=/home/modeswitch
USER ${MODESWITCH_UID}:0
# The Python workers' launcher (modeswitch.runners.worker_python), made now in the user's
# MODESWITCH_CACHE: every container of this image has it at the same path, so a driver in one
# hands it to the executors in the others (docker-compose.yaml: MODESWITCH_WORKERS_LIKE_HERE).
RUN python -m modeswitch.runners.worker_python
WORKDIR /opt/airflow
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["modeswitch", "--help"]
