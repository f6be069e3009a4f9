"""Managed Kafka's ways in, on a real broker: mutual TLS and SASL OAUTHBEARER at an OIDC token
endpoint, each through the project's own clients (confluent-kafka, with the librdkafka
settings as they are) and through Spark's Kafka source (the Java client, with the options
:func:`~modeswitch.sources.spark_kafka.java_options` translates them to).

The broker (Apache Kafka 4.4, :mod:`modeswitch.devtools.kafka_broker`) has two listeners beside
its plaintext one: ``MTLS`` (TLS, a client certificate required) and ``OAUTH`` (SASL
OAUTHBEARER, each token's signature checked against the JWKS of a token endpoint served here).
The certificates (a CA, the broker's for 127.0.0.1, the client's) and the token endpoint's
signing key are made here with ``cryptography``; the token endpoint is a small HTTP server on
loopback that hands a signed JWT to a client that gives the right id and secret.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pyarrow as pa
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.sources.kafka import ENV_KAFKA_CONFIG, SCHEME, KafkaLog
from modeswitch.sources.kafka_security import with_java_properties
from modeswitch.sources.spark_kafka import java_options, read_batch

KEY_PASSWORD = "key-pa$$-marker"
CLIENT_ID = "modeswitch-reader"
CLIENT_SECRET = "oidc-s3cr3t-marker"
AUDIENCE = "modeswitch-test-kafka"
KAFKAS_ALLOWED_URLS = "org.apache.kafka.sasl.oauthbearer.allowed.urls"
"""The JVM system property kafka-clients 3.9.1+ and the broker check OAuth URLs against."""
RECORDS = 12
PARTITIONS = 2


# -- certificates -------------------------------------------------------------------------------


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _certificate(
    name: str,
    key: rsa.RSAPrivateKey,
    issuer: tuple[x509.Certificate, rsa.RSAPrivateKey] | None = None,
    *,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    """A CA's certificate when ``issuer`` is None, else one it signs for ``usage`` (server
    certificates name 127.0.0.1 and localhost, which both clients check the broker against)."""
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_certificate, signer_key = issuer or (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer_certificate.subject if signer_certificate else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer is None:
        usages = {"key_cert_sign": True, "crl_sign": True, "digital_signature": False}
    else:
        usages = {"key_cert_sign": False, "crl_sign": False, "digital_signature": True}
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    builder = builder.add_extension(
        x509.KeyUsage(
            content_commitment=False,
            key_encipherment=issuer is not None,
            data_encipherment=False,
            key_agreement=False,
            encipher_only=False,
            decipher_only=False,
            **usages,
        ),
        critical=True,
    )
    return builder.sign(signer_key, hashes.SHA256())


def _pem(item: x509.Certificate | rsa.RSAPrivateKey, password: str | None = None) -> bytes:
    if isinstance(item, x509.Certificate):
        return item.public_bytes(serialization.Encoding.PEM)
    return item.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class Certificates:
    ca: Path
    broker: Path
    """The broker's key and certificate in one PEM file (its ``ssl.keystore.type=PEM``)."""
    client_configs: dict[str, dict[str, str]]
    """The client's certificate in librdkafka's settings, by form."""


def _certificates(folder: Path) -> Certificates:
    folder.mkdir()
    ca_key, broker_key, client_key = _key(), _key(), _key()
    ca = _certificate("modeswitch-test-ca", ca_key)
    broker = _certificate(
        "127.0.0.1", broker_key, (ca, ca_key), usage=ExtendedKeyUsageOID.SERVER_AUTH
    )
    client = _certificate(
        "modeswitch-client", client_key, (ca, ca_key), usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    files = {
        "ca.pem": _pem(ca),
        "broker.pem": _pem(broker_key) + _pem(broker),
        "client.pem": _pem(client),
        "client.key": _pem(client_key, KEY_PASSWORD),  # encrypted PKCS#8
        "client-and-key.pem": _pem(client) + _pem(client_key),
        "client.p12": pkcs12.serialize_key_and_certificates(
            b"client",
            client_key,
            client,
            [ca],
            serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
        ),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return Certificates(
        ca=folder / "ca.pem",
        broker=folder / "broker.pem",
        client_configs={
            "pem-files-encrypted-key": {
                "ssl.certificate.location": str(folder / "client.pem"),
                "ssl.key.location": str(folder / "client.key"),
                "ssl.key.password": KEY_PASSWORD,
            },
            "pem-one-file": {
                "ssl.certificate.location": str(folder / "client-and-key.pem"),
                "ssl.key.location": str(folder / "client-and-key.pem"),
            },
            "pkcs12": {
                "ssl.keystore.location": str(folder / "client.p12"),
                "ssl.keystore.password": KEY_PASSWORD,
            },
        },
    )


# -- the token endpoint -------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenEndpoint:
    """An OIDC token endpoint (client credentials) and its JWKS on loopback, in a thread."""

    key: rsa.RSAPrivateKey = field(default_factory=_key)
    issued: list[str] = field(default_factory=list)
    """The User-Agent of every request that got a token."""
    refused: int = 0

    def __post_init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def jwks(self) -> dict:
        numbers = self.key.public_key().public_numbers()
        n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
        e = numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")
        jwk = {"kty": "RSA", "kid": "k1", "use": "sig", "alg": "RS256", "n": _b64(n), "e": _b64(e)}
        return {"keys": [jwk]}

    def token(self, scope: str) -> str:
        now = int(time.time())
        claims = {
            "iss": self.url,
            "sub": CLIENT_ID,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + 3600,
            "scope": scope,
        }
        header = {"alg": "RS256", "typ": "JWT", "kid": "k1"}
        signed = ".".join(_b64(json.dumps(part).encode()) for part in (header, claims))
        signature = self.key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signed}.{_b64(signature)}"


def _handler(endpoint: TokenEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:
            pass

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/jwks":
                self._answer(200, endpoint.jwks())
            else:
                self._answer(404, {})

        def do_POST(self) -> None:
            form = parse_qs(self.rfile.read(int(self.headers["Content-Length"] or 0)).decode())
            basic = self.headers.get("Authorization", "").removeprefix("Basic ")
            given = base64.b64decode(basic).decode() if basic else ""
            granted = form.get("grant_type") == ["client_credentials"]
            if self.path != "/token" or given != f"{CLIENT_ID}:{CLIENT_SECRET}" or not granted:
                endpoint.refused += 1
                self._answer(401, {"error": "invalid_client"})
                return
            endpoint.issued.append(self.headers.get("User-Agent", ""))
            scope = form.get("scope", [""])[0]
            self._answer(
                200,
                {"access_token": endpoint.token(scope), "token_type": "Bearer", "expires_in": 3600},
            )

    return Handler


# -- the broker ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuthBroker:
    broker: KafkaBroker
    certificates: Certificates
    tokens: TokenEndpoint

    def mtls_config(self, form: str) -> dict[str, str]:
        return {
            "bootstrap.servers": self.broker.address("MTLS"),
            "security.protocol": "ssl",
            "ssl.ca.location": str(self.certificates.ca),
            **self.certificates.client_configs[form],
        }

    def oauth_config(self) -> dict[str, str]:
        return {
            "bootstrap.servers": self.broker.address("OAUTH"),
            "security.protocol": "sasl_plaintext",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": CLIENT_ID,
            "sasl.oauthbearer.client.secret": CLIENT_SECRET,
            "sasl.oauthbearer.token.endpoint.url": f"{self.tokens.url}/token",
            "sasl.oauthbearer.scope": "kafka",
            "sasl.oauthbearer.extensions": "traceId=modeswitch",
        }


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthBroker]:
    folder = tmp_path_factory.mktemp("kafka-auth")
    certificates = _certificates(folder / "tls")
    tokens = TokenEndpoint()
    try:
        jwks = f"{tokens.url}/jwks"
        module = "org.apache.kafka.common.security.oauthbearer"
        settings = {
            "listener.name.mtls.ssl.keystore.type": "PEM",
            "listener.name.mtls.ssl.keystore.location": str(certificates.broker),
            "listener.name.mtls.ssl.truststore.type": "PEM",
            "listener.name.mtls.ssl.truststore.location": str(certificates.ca),
            "listener.name.mtls.ssl.client.auth": "required",
            "listener.name.oauth.sasl.enabled.mechanisms": "OAUTHBEARER",
            "listener.name.oauth.oauthbearer.sasl.jaas.config": (
                f"{module}.OAuthBearerLoginModule required ;"
            ),
            "listener.name.oauth.oauthbearer.sasl.server.callback.handler.class": (
                f"{module}.OAuthBearerValidatorCallbackHandler"
            ),
            "sasl.oauthbearer.jwks.endpoint.url": jwks,
            "sasl.oauthbearer.expected.audience": AUDIENCE,
            "sasl.oauthbearer.expected.issuer": tokens.url,  # Kafka 4.4 requires one
        }
        with KafkaBroker(
            folder / "broker",
            settings,
            listeners={"MTLS": "SSL", "OAUTH": "SASL_PLAINTEXT"},
            # Kafka 4 reads no URL its JVM does not allow: the JWKS.
            java_options=[f"-D{KAFKAS_ALLOWED_URLS}={jwks}"],
        ) as broker:
            yield AuthBroker(broker, certificates, tokens)
    finally:
        tokens.close()


_topics = iter(range(1_000_000))


def _produce(auth: AuthBroker, config: dict[str, str]) -> str:
    """A new topic of :data:`RECORDS` records, produced with ``config``; its source setting."""
    source = f"{SCHEME}auth-{next(_topics)}"
    auth.broker.create_topic(source.removeprefix(SCHEME), PARTITIONS)
    events = pa.table(
        {
            "bucket": pa.array([i % PARTITIONS for i in range(RECORDS)], pa.int32()),
            "event_time": pa.array(
                [1_700_000_000_000_000 + i for i in range(RECORDS)], pa.timestamp("us")
            ),
            "key": [f"k{i}" for i in range(RECORDS)],
            "value": [json.dumps({"n": i}) for i in range(RECORDS)],
        }
    )
    log = KafkaLog(source, config)
    try:
        assert log.write_events(events) == {0: RECORDS // 2, 1: RECORDS // 2}
    finally:
        log.close()
    return source


def _read_both(spark, source: str, config: dict[str, str]) -> tuple[list, list]:
    """The topic's records as (bucket, offset, key, value): through our log, and through
    Spark's Kafka source with the translated options."""
    log = KafkaLog(source, config)
    try:
        end = log.latest_offsets()
        ours = [
            row
            for bucket in sorted(end)
            for batch in log.read(bucket, 0, end[bucket])
            for row in zip(
                *(batch.column(name).to_pylist() for name in ("bucket", "offset", "key", "value")),
                strict=True,
            )
        ]
    finally:
        log.close()
    frame = read_batch(spark, source, dict.fromkeys(end, 0), end, config=config)
    sparks = [tuple(row) for row in frame.select("bucket", "offset", "key", "value").collect()]
    return sorted(ours), sorted(sparks)


def _redacted_by_spark(spark, options: dict[str, str]) -> dict[str, str]:
    """``options`` as the session's SQL conf redacts a source's options (in plans, the UI and
    the event log)."""
    jvm = spark._jvm
    pairs = jvm.java.util.ArrayList()
    for key, value in options.items():
        pairs.add(jvm.scala.Tuple2(key, value))
    converters = jvm.scala.jdk.javaapi.CollectionConverters
    redacted = (
        spark._jsparkSession.sessionState().conf().redactOptions(converters.asScala(pairs).toSeq())
    )
    return {pair._1(): pair._2() for pair in converters.asJava(redacted)}


def _expected() -> list[tuple]:
    rows = [
        (i % PARTITIONS, i // PARTITIONS, f"k{i}", json.dumps({"n": i})) for i in range(RECORDS)
    ]
    return sorted(rows)


# -- mutual TLS ---------------------------------------------------------------------------------


def test_the_tls_listener_refuses_a_client_without_a_certificate(auth_broker: AuthBroker) -> None:
    """What makes the tests below show the client certificate at work."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config = auth_broker.mtls_config("pkcs12")
    for setting in ("ssl.keystore.location", "ssl.keystore.password"):
        del config[setting]
    admin = AdminClient({**config, "log_level": 0})
    with pytest.raises(KafkaException, match=r"(?i)timed out|ssl|handshake|transport"):
        admin.list_topics(timeout=5)


@pytest.mark.parametrize("form", ["pem-files-encrypted-key", "pem-one-file", "pkcs12"])
def test_mutual_tls_reads_a_topic_through_both_clients(
    spark, auth_broker: AuthBroker, form: str
) -> None:
    config = auth_broker.mtls_config(form)
    source = _produce(auth_broker, config)
    ours, sparks = _read_both(spark, source, config)
    assert ours == sparks == _expected()
    # The key's password, and the key itself, are redacted wherever Spark shows the options.
    options = java_options(config)
    redacted = _redacted_by_spark(spark, options)
    secrets = {k for k, v in options.items() if KEY_PASSWORD in v or "PRIVATE KEY" in v}
    assert secrets  # the password, or the PEM key
    for key in secrets:
        assert redacted[key] != options[key]
        assert KEY_PASSWORD not in redacted[key] and "PRIVATE KEY" not in redacted[key]
    assert redacted["kafka.bootstrap.servers"] == auth_broker.broker.address("MTLS")


# -- OAUTHBEARER --------------------------------------------------------------------------------


def test_oauthbearer_reads_a_topic_through_both_clients_with_tokens_of_the_endpoint(
    spark, auth_broker: AuthBroker
) -> None:
    tokens = auth_broker.tokens
    config = auth_broker.oauth_config()
    source = _produce(auth_broker, config)
    assert tokens.issued  # the producer (librdkafka, which names no User-Agent) logged in
    ours, sparks = _read_both(spark, source, config)
    assert ours == sparks == _expected()
    # Spark's source (the Java client, "Java/17...") logged in with a token of the endpoint.
    assert any(agent.startswith("Java/") for agent in tokens.issued), tokens.issued
    redacted = _redacted_by_spark(spark, java_options(config))
    assert CLIENT_SECRET not in json.dumps(redacted)


_JOB = """
import json, sys
from modeswitch.runners.session import create_spark_session
from modeswitch.sources.spark_kafka import read_batch

source, end, name = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
end = {int(bucket): offset for bucket, offset in end.items()}
conf = {"spark.ui.enabled": "false"}
spark = create_spark_session("kafka-auth-job", master="local[1]", conf=conf)
try:
    frame = read_batch(spark, source, dict.fromkeys(end, 0), end)  # the configuration in force
    rows = frame.select("bucket", "offset", "key", "value").collect()
    print(json.dumps({
        "driver": spark._jvm.java.lang.System.getProperty(name),
        "executors": spark.sparkContext.getConf().get("spark.executor.extraJavaOptions"),
        "rows": sorted(map(list, rows)),
    }))
finally:
    spark.stop()
"""


def test_a_jobs_session_allows_the_token_endpoint_in_force_and_reads_with_it(
    auth_broker: AuthBroker,
) -> None:
    """A job's process, its client configuration in ``MODESWITCH_KAFKA_CONFIG``, starts its
    session: the driver's JVM (and the executors' options) allow the token endpoint, and
    Spark's Kafka source reads the topic with the configuration in force."""
    config = auth_broker.oauth_config()
    source = _produce(auth_broker, config)
    end = {str(bucket): RECORDS // PARTITIONS for bucket in range(PARTITIONS)}
    done = subprocess.run(
        [sys.executable, "-c", _JOB, source, json.dumps(end), KAFKAS_ALLOWED_URLS],
        env={**os.environ, ENV_KAFKA_CONFIG: json.dumps(config)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert CLIENT_SECRET not in done.stdout + done.stderr
    job = json.loads(done.stdout.strip().splitlines()[-1])
    url = config["sasl.oauthbearer.token.endpoint.url"]
    assert job["driver"] == url
    assert f"-D{KAFKAS_ALLOWED_URLS}={url}" in job["executors"].split()  # beside Spark's own
    assert sorted(map(tuple, job["rows"])) == _expected()


def test_the_jvm_option_the_sessions_set_is_the_one_the_java_client_checks(
    spark, auth_broker: AuthBroker
) -> None:
    """kafka-clients 3.9 allows any token endpoint while the JVM's property is unset, and only
    those it lists once set (4.0 and later: none unset). Set in this JVM (Spark's driver and, on
    a local master, its executors) to what :func:`with_java_properties` gives, the read goes
    through; set to another URL, the Java client refuses the endpoint."""
    config = auth_broker.oauth_config()
    source = _produce(auth_broker, config)
    name, _, value = with_java_properties(None, config).removeprefix("-D").partition("=")
    assert name == KAFKAS_ALLOWED_URLS

    def read(attempt: str) -> list[tuple]:
        # The Java client keeps one login per JAAS configuration while a client uses it (and
        # Spark keeps its consumers): another extension makes each read log in afresh.
        fresh = {**config, "sasl.oauthbearer.extensions": f"attempt={attempt}"}
        return _read_both(spark, source, fresh)[1]

    system = spark._jvm.java.lang.System
    try:
        system.setProperty(name, value)
        assert read("allowed") == _expected()
        system.setProperty(name, f"{auth_broker.tokens.url}/elsewhere")
        with pytest.raises(Exception, match="is not allowed"):
            read("refused")
    finally:
        system.clearProperty(name)
