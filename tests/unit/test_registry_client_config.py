"""Under Airflow a registry-framed Avro payload's schema registry is an Airflow Connection (the
``schema_registry_connection`` setting): its host, login, password and extras become the
registry client's settings, which the jobs and their executors get in their environment like a
Kafka source's client configuration (tests/airflow/test_registry_connection.py: spark-submit's)."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from modeswitch.airflow.settings import registry_config_from_connection
from modeswitch.errors import ConfigError
from modeswitch.runners.engine import credentials_fingerprint
from modeswitch.runners.session import (
    CREDENTIAL_ENVIRONMENT,
    EXECUTOR_ENVIRONMENT,
    REDACTION_REGEX,
)
from modeswitch.sources.schema_registry import registry_environment

pytestmark = pytest.mark.unit

PASSWORD = "r3gistry-s3cr3t"


def connection(**fields: Any) -> SimpleNamespace:
    """An Airflow Connection's fields, as ``BaseHook.get_connection`` returns them."""
    given = {
        "conn_id": "schema_registry_default",
        "conn_type": "http",
        "host": None,
        "schema": None,
        "port": None,
        "login": None,
        "password": None,
        "extra_dejson": {},
        **fields,
    }
    return SimpleNamespace(**given)


@pytest.mark.parametrize(
    ("fields", "url"),
    [
        ({"host": "http://registry:8081"}, "http://registry:8081"),
        ({"host": "registry", "schema": "http", "port": 8081}, "http://registry:8081"),
        ({"host": "registry", "schema": "https"}, "https://registry"),
        ({"host": "registry"}, "http://registry"),
        # The URL holds a scheme: as it is, the port added after its host, before its path.
        (
            {"host": "https://r.example/apis/ccompat/v7", "port": 443},
            "https://r.example:443/apis/ccompat/v7",
        ),
        ({"host": "http://registry:8081", "port": 8081}, "http://registry:8081"),
        # AIRFLOW_CONN_..='https://registry:8080/apis/ccompat/v7': Airflow's parse of a URI.
        (
            {"conn_type": "https", "host": "registry", "schema": "apis/ccompat/v7", "port": 8080},
            "https://registry:8080/apis/ccompat/v7",
        ),
    ],
)
def test_the_connections_host_schema_and_port_are_the_registrys_url(fields, url) -> None:
    assert registry_config_from_connection(connection(**fields)) == {"url": url}


def test_login_and_password_are_basic_credentials_and_the_extras_win() -> None:
    config = registry_config_from_connection(
        connection(
            host="registry",
            port=8081,
            login="reader",
            password=PASSWORD,
            extra_dejson={"url": "https://elsewhere:8443", "ssl.ca.location": "/ca.pem"},
        )
    )
    assert config == {
        "url": "https://elsewhere:8443",
        "basic.auth.credentials.source": "USER_INFO",
        "basic.auth.user.info": f"reader:{PASSWORD}",
        "ssl.ca.location": "/ca.pem",
    }
    only_extras = connection(extra_dejson={"url": "http://registry:8081", "timeout": 10})
    assert registry_config_from_connection(only_extras) == {
        "url": "http://registry:8081",
        "timeout": "10",
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"login": "reader", "password": PASSWORD}, "has no host and no url in its extras"),
        ({"host": "  ", "extra_dejson": {"timeout": 10}}, "has no host and no url"),
        ({"host": f"http://reader:{PASSWORD}@registry:8081", "port": 9}, "keep one"),
        ({"host": f"http://reader:{PASSWORD}@registry:x", "port": 1}, "not a number"),
        ({"host": "registry", "extra_dejson": [PASSWORD]}, "not a JSON object"),
    ],
)
def test_a_connection_without_a_url_is_refused_naming_the_setting(fields, message) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        registry_config_from_connection(connection(**fields))
    assert raised.value.setting == "schema_registry_connection"
    assert str(raised.value).startswith(
        "schema_registry_connection: Airflow connection 'schema_registry_default'"
    )
    assert PASSWORD not in str(raised.value)


def test_an_engine_started_with_other_registry_credentials_is_not_shared() -> None:
    """The registry's configuration is not handed to the executors (only the driver asks the
    registry), is redacted, and is among the credentials a warm engine is started with."""

    def environment(password: str) -> dict[str, str]:
        config = {"url": "http://registry:8081", "basic.auth.user.info": f"reader:{password}"}
        return {"HOME": "/a", **registry_environment(config)}

    name = next(iter(registry_environment({"url": "http://registry:8081"})))
    assert name not in EXECUTOR_ENVIRONMENT and name in CREDENTIAL_ENVIRONMENT
    assert re.search(REDACTION_REGEX, f"spark.executorEnv.{name}")
    old, new = (credentials_fingerprint(environment(p)) for p in ("old", "new"))
    assert old != new
    assert credentials_fingerprint({"HOME": "/a"}) not in (old, new)
