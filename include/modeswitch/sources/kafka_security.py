"""How a Kafka client proves who it is, said once in librdkafka's settings and translated here
for the Java client (Spark's Kafka source, kafka-clients 3.9.2 beside Spark 4.2).

The configuration in force (``MODESWITCH_KAFKA_CONFIG``, or the ``kafka_connection``'s extras)
is librdkafka's, which the project's own clients (confluent-kafka) take as they are. Managed
Kafka services ask for one of three things, each a different set of settings in the two
clients; :func:`java_security` gives the Java client's (names without Spark's ``kafka.``
prefix) for these librdkafka settings:

- **SASL PLAIN or SCRAM** (``sasl.mechanism(s)``, ``sasl.username``, ``sasl.password``): a
  JAAS login in ``sasl.jaas.config``.
- **Mutual TLS**: ``ssl.certificate.location`` with ``ssl.key.location`` (PEM files, the key
  optionally encrypted: ``ssl.key.password``), or ``ssl.keystore.location`` with
  ``ssl.keystore.password`` (PKCS#12). The Java client has no setting for a key file apart
  from its certificate, and reads fewer forms of key than librdkafka (OpenSSL): PKCS#8 only,
  and on Java 17 no key encrypted the way OpenSSL 3 encrypts by default (PBES2). The PEM files
  are read here, on the driver, the key decrypted and made unencrypted PKCS#8 (``cryptography``),
  and both handed over as ``ssl.keystore.certificate.chain`` and ``ssl.keystore.key``
  (``ssl.keystore.type=PEM``): any key librdkafka takes works, a wrong password is refused
  before a query starts, and the executors need no copy of the files. The decrypted key is no
  more exposed than the encrypted key and its password would be, side by side in the same
  options. A PKCS#12 keystore stays a file (``ssl.keystore.type=PKCS12``) the executors must
  have, as the CA file ``ssl.ca.location`` (a PEM trust store) already is.
- **SASL OAUTHBEARER with an OIDC token endpoint** (``sasl.oauthbearer.method=oidc``, the
  client credentials grant): the Java client's login callback handler for a token endpoint,
  ``sasl.oauthbearer.token.endpoint.url``, and a JAAS login holding the client id, secret,
  scope and SASL extensions. kafka-clients 3.9.1 and later check that URL against the JVM's
  system property :data:`ALLOWED_URLS_PROPERTY`: unset, 3.9 allows any URL and 4.0 none.
  :func:`with_java_properties` adds the token endpoint's URL to a JVM's options: the
  sessions (``modeswitch.runners.session``) and the spark-submits
  (``modeswitch.runners.submit``) set it on the driver and the executors where such a
  configuration is in force, so that a newer kafka-clients works too. A URL is no secret; the
  client secret never goes on a JVM's options.

Secrets reach Spark only under option names (or in values) that Spark's redaction pattern
matches (``modeswitch.runners.session.REDACTION_REGEX``): ``ssl.keystore.password``,
``sasl.jaas.config`` (its value names ``password`` or ``clientSecret``), and
``ssl.keystore.key``, which the project's pattern adds to Spark's.

Everything here is a pure function of the settings, apart from reading the two PEM files.
Errors name the setting, and a file's path, never a secret's value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from modeswitch.errors import ConfigError

ALLOWED_URLS_PROPERTY = "org.apache.kafka.sasl.oauthbearer.allowed.urls"
"""The JVM system property kafka-clients (3.9.1 and later) checks an OAuth token endpoint's URL
against: a comma-separated list of URLs. Unset, kafka-clients 3.9 allows every URL, 4.0 and
later none (the Kafka broker of the tests, 4.4, needs it for its JWKS endpoint)."""

OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
OAUTHBEARER_LOGIN_HANDLER = (
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
)
"""The Java client's login callback handler for a token endpoint (since kafka-clients 3.4 in
this package; the ``...oauthbearer.secured`` one is its deprecated alias)."""

JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
"""The JAAS login module of each SASL mechanism that logs in with a username and password."""

OAUTHBEARER_SETTINGS = frozenset(
    {
        "sasl.oauthbearer.method",
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.token.endpoint.url",
        "sasl.oauthbearer.scope",
        "sasl.oauthbearer.extensions",
    }
)
SECURITY_SETTINGS = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.keystore.location",
        "ssl.keystore.password",
        *OAUTHBEARER_SETTINGS,
    }
)
"""The librdkafka settings :func:`java_security` translates."""

_PEM_BLOCK = re.compile(
    r"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----", flags=re.DOTALL | re.ASCII
)
_EXTENSION_KEY = re.compile(r"[A-Za-z]+")  # an extension's key in RFC 7628


def java_security(config: Mapping[str, Any]) -> dict[str, str]:
    """The Java client's settings (no ``kafka.`` prefix) for the :data:`SECURITY_SETTINGS` in
    librdkafka's ``config``; other settings are not looked at. Raises :class:`ConfigError`
    naming the setting where the two clients cannot be made to agree; see the module
    docstring."""
    java: dict[str, str] = {}
    if "security.protocol" in config:
        java["security.protocol"] = str(config["security.protocol"]).upper()
    if "ssl.ca.location" in config:
        java["ssl.truststore.location"] = str(config["ssl.ca.location"])
        java["ssl.truststore.type"] = "PEM"
    java |= _client_certificate(config)
    java |= _sasl(config)
    return java


def _client_certificate(config: Mapping[str, Any]) -> dict[str, str]:
    """The keystore of mutual TLS: a PKCS#12 file, or the PEM files' blocks."""
    certificate = config.get("ssl.certificate.location")
    key = config.get("ssl.key.location")
    keystore = config.get("ssl.keystore.location")
    if keystore is not None and (certificate is not None or key is not None):
        raise ConfigError(
            "kafka client settings ssl.keystore.location and ssl.certificate.location/"
            "ssl.key.location: the client has one certificate; give a PKCS#12 keystore or the "
            "PEM files, not both",
            setting="ssl.keystore.location",
        )
    if keystore is None and "ssl.keystore.password" in config:
        _refuse("ssl.keystore.password", "is the password of ssl.keystore.location, not given")
    if key is None and "ssl.key.password" in config:
        _refuse("ssl.key.password", "is the password of ssl.key.location's key, not given")
    if keystore is not None:
        password = config.get("ssl.keystore.password")
        if not password:
            _refuse(
                "ssl.keystore.location",
                "needs ssl.keystore.password: the Java client opens a PKCS#12 keystore with it",
            )
        return {
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(keystore),
            "ssl.keystore.password": str(password),
        }
    if certificate is None and key is None:
        return {}
    if certificate is None or key is None:
        given, missing = (
            ("ssl.key.location", "ssl.certificate.location")
            if certificate is None
            else ("ssl.certificate.location", "ssl.key.location")
        )
        _refuse(given, f"needs {missing}: a client certificate is its chain and its key")
    chain = [
        text
        for label, text in _pem_blocks("ssl.certificate.location", certificate)
        if label == "CERTIFICATE"
    ]
    if not chain:
        _refuse("ssl.certificate.location", f"{certificate} holds no PEM certificate")
    keys = [text for label, text in _pem_blocks("ssl.key.location", key) if "PRIVATE KEY" in label]
    if len(keys) != 1:
        _refuse("ssl.key.location", f"{key} holds {len(keys)} PEM private keys, not one")
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "\n".join(chain),
        "ssl.keystore.key": _pkcs8(keys[0], key, config.get("ssl.key.password")),
    }


def _pkcs8(block: str, path: Any, password: Any) -> str:
    """The PEM key ``block`` (of the file at ``path``), decrypted with ``password`` where it is
    encrypted, as an unencrypted PKCS#8 PEM block: the one form of key every Java client reads.
    librdkafka (OpenSSL) takes PKCS#1 and SEC1 keys too, and encrypted ones in any scheme;
    kafka-clients 3.9 on Java 17 reads PKCS#8 only, and of encrypted keys not those of OpenSSL
    3's default scheme (PBES2: "PBES2 SecretKeyFactory not available"). An unused password is
    ignored, as librdkafka ignores it."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    secret = None if password is None or password == "" else str(password).encode()
    data, problem = block.encode(), None
    try:
        loaded = serialization.load_pem_private_key(data, secret)
    except TypeError:  # a password for a key that is not encrypted, or none for one that is
        if secret is None:
            problem = "is encrypted: it needs ssl.key.password"
        else:
            loaded = serialization.load_pem_private_key(data, None)
    except (ValueError, UnsupportedAlgorithm):
        # Not chained: the cause could quote the key's bytes.
        problem = "ssl.key.password does not decrypt its key" if secret else "holds no key"
    if problem:
        _refuse("ssl.key.location", f"{path} {problem}")
    return loaded.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _pem_blocks(setting: str, path: Any) -> list[tuple[str, str]]:
    """The file's PEM blocks, as (label, block); what lies between them is left out (a
    certificate file may also hold its key: only its certificates go to the chain)."""
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not text (a DER file?)"
        raise ConfigError(
            f"kafka client setting {setting}: cannot read {path}: {reason}", setting=setting
        ) from None  # never chained: the exception could quote the file's bytes
    return [(match.group(1), match.group(0)) for match in _PEM_BLOCK.finditer(text)]


def _sasl(config: Mapping[str, Any]) -> dict[str, str]:
    """The SASL mechanism and its JAAS login (with OAUTHBEARER, the token endpoint's)."""
    given = config.get("sasl.mechanisms") or config.get("sasl.mechanism")  # either name
    mechanism = str(given or "PLAIN").upper()
    if mechanism == "OAUTHBEARER":
        return _oauthbearer(config)
    stray = sorted(OAUTHBEARER_SETTINGS & set(config))
    if stray:
        _refuse(stray[0], f"is an OAUTHBEARER setting, and sasl.mechanism is {mechanism!r}")
    username, password = config.get("sasl.username"), config.get("sasl.password")
    if username is None and password is None:
        return {} if given is None else {"sasl.mechanism": mechanism}
    module = JAAS_MODULES.get(mechanism)
    if module is None:
        raise ConfigError(
            f"kafka client setting sasl.mechanism {mechanism!r}: a username and password "
            f"log in with one of {', '.join(JAAS_MODULES)}",
            setting="sasl.mechanism",
        )
    return {
        "sasl.mechanism": mechanism,
        "sasl.jaas.config": (
            f"{module} required username={jaas_quote(username or '')} "
            f"password={jaas_quote(password or '')};"
        ),
    }


def _oauthbearer(config: Mapping[str, Any]) -> dict[str, str]:
    """OAUTHBEARER with librdkafka's ``oidc`` method: the client credentials grant at a token
    endpoint. ``sasl.username``/``sasl.password`` are not used by it, in either client."""
    method = str(config.get("sasl.oauthbearer.method", "default")).lower()
    if method != "oidc":
        _refuse(
            "sasl.oauthbearer.method",
            f"{method!r}: Spark's Kafka source logs in at a token endpoint (oidc) only; "
            "librdkafka's default method (an unsecured token, or one the application sets) has "
            "no Java counterpart here",
        )
    for required in (
        "sasl.oauthbearer.token.endpoint.url",
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.secret",
    ):
        if not config.get(required):
            _refuse("sasl.oauthbearer.method", f"oidc needs {required}")
    url = str(config["sasl.oauthbearer.token.endpoint.url"])
    problem = _url_problem(url)
    if problem:
        _refuse("sasl.oauthbearer.token.endpoint.url", problem)
    login = [
        f"clientId={jaas_quote(config['sasl.oauthbearer.client.id'])}",
        f"clientSecret={jaas_quote(config['sasl.oauthbearer.client.secret'])}",
    ]
    if config.get("sasl.oauthbearer.scope"):
        login.append(f"scope={jaas_quote(config['sasl.oauthbearer.scope'])}")
    for key, value in _extensions(config.get("sasl.oauthbearer.extensions")):
        login.append(f"extension_{key}={jaas_quote(value)}")
    return {
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.login.callback.handler.class": OAUTHBEARER_LOGIN_HANDLER,
        "sasl.oauthbearer.token.endpoint.url": url,
        "sasl.jaas.config": f"{OAUTHBEARER_LOGIN_MODULE} required {' '.join(login)};",
    }


def _url_problem(url: str) -> str | None:
    """Why the token endpoint's ``url`` cannot be used, or None. It goes on the JVMs' options
    (:data:`ALLOWED_URLS_PROPERTY`: a comma-separated list, in options split at spaces), which
    are not secret."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http(s) URL"
    if parts.username is not None or parts.password is not None:
        return (
            "holds credentials; the client's go in sasl.oauthbearer.client.id and "
            "sasl.oauthbearer.client.secret"
        )
    if "," in url or any(character.isspace() for character in url):
        return "holds a comma or a space"
    return None


def _extensions(text: Any) -> list[tuple[str, str]]:
    """librdkafka's ``sasl.oauthbearer.extensions`` (``key=value,key=value``) as pairs."""
    pairs = []
    for item in str(text or "").split(","):
        if not item.strip():
            continue
        key, equals, value = item.partition("=")
        if not equals or not _EXTENSION_KEY.fullmatch(key.strip()):
            _refuse(
                "sasl.oauthbearer.extensions",
                "is not a comma-separated list of key=value pairs with keys of letters only",
            )
        pairs.append((key.strip(), value))
    return pairs


def oauthbearer_token_url(config: Mapping[str, Any]) -> str | None:
    """The OIDC token endpoint the configuration logs in at, or None (also for a URL
    :func:`java_security` refuses)."""
    mechanism = str(config.get("sasl.mechanisms") or config.get("sasl.mechanism") or "")
    method = str(config.get("sasl.oauthbearer.method", "")).lower()
    url = str(config.get("sasl.oauthbearer.token.endpoint.url") or "")
    if mechanism.upper() == "OAUTHBEARER" and method == "oidc" and url and not _url_problem(url):
        return url
    return None


def with_java_properties(existing: str | None, config: Mapping[str, Any]) -> str:
    """A JVM's options ``existing`` with what the Java client needs of the JVM for librdkafka's
    ``config``: the token endpoint's URL in :data:`ALLOWED_URLS_PROPERTY` under OAUTHBEARER.
    Options that set the property already (a deployment's own list) are left as they are."""
    existing = (existing or "").strip()
    url = oauthbearer_token_url(config)
    if url is None or f"-D{ALLOWED_URLS_PROPERTY}=" in existing:
        return existing
    return f"{existing} -D{ALLOWED_URLS_PROPERTY}={url}".strip()


def jaas_quote(text: Any) -> str:
    """``text`` as a quoted JAAS option value."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _refuse(setting: str, reason: str) -> NoReturn:
    raise ConfigError(f"kafka client setting {setting} {reason}", setting=setting)


__all__ = [
    "ALLOWED_URLS_PROPERTY",
    "JAAS_MODULES",
    "OAUTHBEARER_LOGIN_HANDLER",
    "OAUTHBEARER_LOGIN_MODULE",
    "SECURITY_SETTINGS",
    "jaas_quote",
    "java_security",
    "oauthbearer_token_url",
    "with_java_properties",
]
