"""librdkafka's settings as Spark's Kafka source takes them, and its offsets log as the sink
reads it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from modeswitch.errors import ConfigError, ModeswitchError
from modeswitch.runners.session import REDACTION_REGEX
from modeswitch.sinks.stream_offsets import offsets_log_entry
from modeswitch.sources import log_type
from modeswitch.sources.kafka import KafkaLocation
from modeswitch.sources.kafka_security import with_java_properties
from modeswitch.sources.spark_kafka import (
    READ_MAX_POLL_RECORDS,
    _options,
    java_options,
    topic_offsets_json,
)

SECRET = 'pa"ss\\w0rd-marker'


def test_a_plain_broker_needs_only_its_address() -> None:
    assert java_options({"bootstrap.servers": "b:9092", "group.id": "x", "linger.ms": 5}) == {
        "kafka.bootstrap.servers": "b:9092",
        "kafka.isolation.level": "read_committed",
    }


@pytest.mark.parametrize(
    ("mechanism", "module"),
    [
        (None, "org.apache.kafka.common.security.plain.PlainLoginModule"),
        ("plain", "org.apache.kafka.common.security.plain.PlainLoginModule"),
        ("SCRAM-SHA-512", "org.apache.kafka.common.security.scram.ScramLoginModule"),
    ],
)
def test_sasl_credentials_become_a_jaas_login(mechanism: str | None, module: str) -> None:
    config = {
        "bootstrap.servers": "b:9093",
        "security.protocol": "sasl_ssl",
        "sasl.username": "svc",
        "sasl.password": SECRET,
        "ssl.ca.location": "/etc/ca.pem",
    }
    if mechanism:
        config["sasl.mechanisms"] = mechanism
    options = java_options(config)
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == (mechanism or "PLAIN").upper()
    assert options["kafka.sasl.jaas.config"] == (
        f'{module} required username="svc" password="pa\\"ss\\\\w0rd-marker";'
    )
    # Spark redacts an option whose key or value matches its default redaction pattern.
    assert "password" in options["kafka.sasl.jaas.config"]
    assert options["kafka.ssl.truststore.location"] == "/etc/ca.pem"
    assert options["kafka.ssl.truststore.type"] == "PEM"


def test_a_setting_the_java_client_cannot_take_is_refused_by_name_not_value() -> None:
    with pytest.raises(ConfigError, match=r"'sasl\.oauthbearer\.config'") as refused:
        java_options({"bootstrap.servers": "b:9092", "sasl.oauthbearer.config": SECRET})
    assert SECRET not in str(refused.value)
    with pytest.raises(ConfigError, match="GSSAPI"):
        java_options(
            {"bootstrap.servers": "b", "sasl.mechanism": "GSSAPI", "sasl.password": SECRET}
        )


class _Reader:
    """What a read's options builder is given: the options, in order."""

    def __init__(self) -> None:
        self.given: dict[str, str] = {}

    def format(self, _name: str) -> _Reader:
        return self

    def option(self, key: str, value: str) -> _Reader:
        self.given[key] = value
        return self

    def options(self, **more: str) -> _Reader:
        self.given.update(more)
        return self


def test_every_read_polls_many_records_at_once() -> None:
    reader = _Reader()
    location = KafkaLocation.parse("kafka://events")
    _options(reader, location, {0: 3}, java_options({"bootstrap.servers": "b:9092"}))
    assert reader.given["kafka.max.poll.records"] == str(READ_MAX_POLL_RECORDS)
    assert READ_MAX_POLL_RECORDS >= 10_000  # not the Java client's 500
    assert reader.given["startingOffsets"] == '{"events": {"0": 3}}'
    assert reader.given["kafka.isolation.level"] == "read_committed"
    assert reader.given["includeHeaders"] == "false"
    headers = _Reader()
    _options(headers, KafkaLocation.parse("kafka://events?headers=true"), {0: 3}, {})
    assert headers.given["includeHeaders"] == "true"


def test_the_log_names_its_spark_source() -> None:
    assert log_type("kafka://events").spark_source == "kafka"
    assert log_type("/data/log").spark_source == "bucketlog"


def _offsets_log(checkpoint: Path, batch: int, line: str) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{line}\n')


def test_the_sink_reads_the_kafka_sources_offsets_log(tmp_path: Path) -> None:
    _offsets_log(tmp_path, 0, topic_offsets_json("events", {1: 40, 0: 12}))
    _offsets_log(tmp_path, 1, '{"0": 5, "1": 6}')  # the bucketlog source's form
    _offsets_log(tmp_path, 2, '{"a": {"0": 1}, "b": {"0": 2}}')
    assert offsets_log_entry(str(tmp_path), 0) == {0: 12, 1: 40}
    assert offsets_log_entry(str(tmp_path), 1) == {0: 5, 1: 6}
    with pytest.raises(ModeswitchError, match="topics \\['a', 'b'\\]"):
        offsets_log_entry(str(tmp_path), 2)
    assert offsets_log_entry(str(tmp_path), 3) is None


# -- authentication: mutual TLS and OAUTHBEARER (modeswitch.sources.kafka_security) ------------


def _pem(label: str, body: str) -> str:
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----\n"


def _key_pem(form: serialization.PrivateFormat, password: str | None = None) -> str:
    encryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    return _CLIENT_KEY.private_bytes(serialization.Encoding.PEM, form, encryption).decode()


_CLIENT_KEY = ec.generate_private_key(ec.SECP256R1())  # EC: made in microseconds
LEAF, INTERMEDIATE = _pem("CERTIFICATE", "TGVhZg=="), _pem("CERTIFICATE", "SW50ZXI=")
KEY = _key_pem(serialization.PrivateFormat.PKCS8)
"""What the Java client gets for each form of the key librdkafka takes."""
MTLS = {"bootstrap.servers": "b:9093", "security.protocol": "ssl", "ssl.ca.location": "/ca.pem"}


def _files(tmp_path: Path, certificate: str, key: str) -> dict[str, str]:
    (tmp_path / "client.pem").write_text(certificate)
    (tmp_path / "client.key").write_text(key)
    return {
        "ssl.certificate.location": str(tmp_path / "client.pem"),
        "ssl.key.location": str(tmp_path / "client.key"),
    }


def test_mutual_tls_with_pem_files_hands_the_java_client_their_chain_and_key(
    tmp_path: Path,
) -> None:
    # librdkafka's files may carry text around the blocks; an unused password is ignored.
    config = {
        **MTLS,
        **_files(tmp_path, f"subject=leaf\n{LEAF}issuer=ca\n{INTERMEDIATE}", KEY),
        "ssl.key.password": SECRET,
    }
    options = java_options(config)
    assert options == {
        "kafka.isolation.level": "read_committed",
        "kafka.bootstrap.servers": "b:9093",
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.location": "/ca.pem",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.keystore.certificate.chain": LEAF + INTERMEDIATE.rstrip("\n"),
        "kafka.ssl.keystore.key": KEY,
    }


def test_a_certificate_file_that_holds_its_key_gives_only_certificates_to_the_chain(
    tmp_path: Path,
) -> None:
    files = _files(tmp_path, KEY + LEAF, "")
    files["ssl.key.location"] = files["ssl.certificate.location"]  # one file, as librdkafka allows
    options = java_options({**MTLS, **files})
    assert options["kafka.ssl.keystore.certificate.chain"] == LEAF.rstrip("\n")
    assert options["kafka.ssl.keystore.key"] == KEY


@pytest.mark.parametrize(
    ("form", "password"),
    [
        (serialization.PrivateFormat.PKCS8, SECRET),  # PBES2: Java 17's client cannot decrypt it
        (serialization.PrivateFormat.TraditionalOpenSSL, None),  # SEC1: Java reads PKCS#8 only
        (serialization.PrivateFormat.TraditionalOpenSSL, SECRET),  # "Proc-Type: 4,ENCRYPTED"
    ],
    ids=["pkcs8-encrypted", "sec1", "sec1-encrypted"],
)
def test_a_key_the_java_client_cannot_read_reaches_it_decrypted_as_pkcs8(
    tmp_path: Path, form: serialization.PrivateFormat, password: str | None
) -> None:
    files = _files(tmp_path, LEAF, _key_pem(form, password))
    given = {**MTLS, **files, **({"ssl.key.password": password} if password else {})}
    options = java_options(given)
    assert options["kafka.ssl.keystore.key"] == KEY
    assert "kafka.ssl.key.password" not in options
    if password:
        with pytest.raises(ConfigError, match=r"ssl\.key\.location .* is encrypted: it needs"):
            java_options({**MTLS, **files})
        with pytest.raises(ConfigError, match=r"ssl\.key\.password does not decrypt") as wrong:
            java_options({**MTLS, **files, "ssl.key.password": "not-" + SECRET})
        assert SECRET not in str(wrong.value) and wrong.value.__cause__ is None


def test_mutual_tls_with_a_pkcs12_keystore_stays_a_file() -> None:
    config = {**MTLS, "ssl.keystore.location": "/c.p12", "ssl.keystore.password": SECRET}
    options = java_options(config)
    assert {k: v for k, v in options.items() if k.startswith("kafka.ssl.keystore")} == {
        "kafka.ssl.keystore.type": "PKCS12",
        "kafka.ssl.keystore.location": "/c.p12",
        "kafka.ssl.keystore.password": SECRET,
    }


OAUTH = {
    "bootstrap.servers": "b:9094",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "OAUTHBEARER",
    "sasl.oauthbearer.method": "oidc",
    "sasl.oauthbearer.client.id": "svc-reader",
    "sasl.oauthbearer.client.secret": SECRET,
    "sasl.oauthbearer.token.endpoint.url": "https://idp.example/oauth2/token",
    "sasl.oauthbearer.scope": "kafka read",
    "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,identityPoolId=pool-2",
}


def test_oauthbearer_at_a_token_endpoint_becomes_the_java_clients_oidc_login() -> None:
    options = java_options(OAUTH)
    assert options == {
        "kafka.isolation.level": "read_committed",
        "kafka.bootstrap.servers": "b:9094",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "OAUTHBEARER",
        "kafka.sasl.login.callback.handler.class": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
        ),
        "kafka.sasl.oauthbearer.token.endpoint.url": "https://idp.example/oauth2/token",
        "kafka.sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'clientId="svc-reader" clientSecret="pa\\"ss\\\\w0rd-marker" scope="kafka read" '
            'extension_logicalCluster="lkc-1" extension_identityPoolId="pool-2";'
        ),
    }


@pytest.mark.parametrize(
    "config",
    [
        {**MTLS, "ssl.keystore.location": "/c.p12", "ssl.keystore.password": SECRET},
        {**OAUTH, "sasl.oauthbearer.extensions": ""},
        {"bootstrap.servers": "b", "sasl.username": "u", "sasl.password": SECRET},
    ],
    ids=["pkcs12", "oauthbearer", "plain"],
)
def test_every_option_holding_a_secret_is_one_sessions_redact(config: dict[str, str]) -> None:
    """Spark redacts an option whose key or value its redaction pattern matches: in plans, the
    UI and the event log. Our sessions set REDACTION_REGEX."""
    options = java_options(config)
    holding = [key for key, value in options.items() if "w0rd-marker" in value]
    assert holding
    for key in holding:
        assert re.search(REDACTION_REGEX, key) or re.search(REDACTION_REGEX, options[key]), key


def test_a_pem_private_key_option_is_redacted_by_its_name(tmp_path: Path) -> None:
    options = java_options({**MTLS, **_files(tmp_path, LEAF, KEY)})
    assert re.search(REDACTION_REGEX, "kafka.ssl.keystore.key")
    assert not re.search(SPARKS_DEFAULT_REDACTION, "kafka.ssl.keystore.key")  # why ours adds it
    assert not re.search(SPARKS_DEFAULT_REDACTION, options["kafka.ssl.keystore.key"])
    assert not re.search(REDACTION_REGEX, "kafka.ssl.keystore.certificate.chain")


SPARKS_DEFAULT_REDACTION = r"(?i)secret|password|token|access[.]?key"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"ssl.key.password": SECRET}, r"ssl\.key\.password .*ssl\.key\.location"),
        ({"ssl.keystore.password": SECRET}, r"ssl\.keystore\.password"),
        ({"ssl.keystore.location": "/c.p12"}, r"ssl\.keystore\.location needs ssl\.keystore\.pass"),
        ({"ssl.certificate.location": "/c.pem"}, r"ssl\.certificate\.location needs ssl\.key\."),
        (
            {
                "ssl.keystore.location": "/c.p12",
                "ssl.key.location": "/k",
                "ssl.key.password": SECRET,
            },
            r"ssl\.keystore\.location and ssl\.certificate\.location/ssl\.key\.location",
        ),
        ({**OAUTH, "sasl.oauthbearer.method": "default"}, r"sasl\.oauthbearer\.method 'default'"),
        (
            {**OAUTH, "sasl.oauthbearer.client.secret": ""},
            r"oidc needs sasl\.oauthbearer\.client\.secret",
        ),
        (
            {**OAUTH, "sasl.oauthbearer.token.endpoint.url": f"https://u:{SECRET}@idp/token"},
            r"token\.endpoint\.url holds credentials",
        ),
        (
            {**OAUTH, "sasl.oauthbearer.token.endpoint.url": "https://idp/a,https://idp/b"},
            r"token\.endpoint\.url holds a comma or a space",
        ),
        (
            {**OAUTH, "sasl.oauthbearer.extensions": f"x-y={SECRET}"},
            r"sasl\.oauthbearer\.extensions is not",
        ),
        (
            {"sasl.mechanism": "PLAIN", "sasl.oauthbearer.client.secret": SECRET},
            r"sasl\.oauthbearer\.client\.secret is an OAUTHBEARER setting",
        ),
    ],
)
def test_an_incomplete_authentication_is_refused_by_name_not_value(
    change: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError, match=named) as refused:
        java_options({**MTLS, **change})
    assert SECRET not in str(refused.value)
    assert "w0rd-marker" not in repr(refused.value.__cause__)


def test_files_that_hold_no_certificate_or_key_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ssl\.key\.location .* holds 0 PEM private keys"):
        java_options({**MTLS, **_files(tmp_path, LEAF, LEAF)})
    with pytest.raises(ConfigError, match=r"ssl\.certificate\.location .* no PEM certificate"):
        java_options({**MTLS, **_files(tmp_path, KEY, KEY)})
    broken = _pem("PRIVATE KEY", "S2V5LW1hcmtlcg==")
    with pytest.raises(ConfigError, match=r"ssl\.key\.location .* holds no key") as refused:
        java_options({**MTLS, **_files(tmp_path, LEAF, broken)})
    assert "S2V5LW1hcmtlcg==" not in str(refused.value) and refused.value.__cause__ is None
    missing = {"ssl.certificate.location": "/nowhere.pem", "ssl.key.location": "/nowhere.key"}
    with pytest.raises(ConfigError, match=r"ssl\.certificate\.location: cannot read /nowhere"):
        java_options({**MTLS, **missing})


def test_oauthbearer_allows_its_token_endpoint_in_the_jvms_options_and_nothing_else() -> None:
    allowed = "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=https://idp.example/oauth2/token"
    assert with_java_properties(None, OAUTH) == allowed
    assert with_java_properties("-Xss4m", OAUTH) == f"-Xss4m {allowed}"
    own = "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=https://a,https://b"
    assert with_java_properties(own, OAUTH) == own  # the deployment's own list stays
    assert with_java_properties("-Xss4m", MTLS) == "-Xss4m"
    assert with_java_properties(None, {**OAUTH, "sasl.oauthbearer.method": "default"}) == ""
    spaced = {**OAUTH, "sasl.oauthbearer.token.endpoint.url": "https://idp/a -XX:+Crash"}
    assert with_java_properties("-Xss4m", spaced) == "-Xss4m"  # refused by java_options
