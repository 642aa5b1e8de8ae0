"""Keys, certificates and gRPC credentials of a hushnet network.

Why ECDSA P-256: gRPC's bundled TLS stack (BoringSSL) accepts P-256 certificates for both
server and client authentication on every platform; ``tests/net/test_net_pki.py``
checks that a real mutual-TLS handshake with these certificates succeeds.

Identities live in a SAN URI: ``hushnet://node/<id>`` for nodes and
``hushnet://operator/<name>`` for operators. Node certificates also carry the DNS name
``<id>.node.hushnet`` so that a client can pin the *server's* identity with
``grpc.ssl_target_name_override`` (the client dials an IP address but checks the name of the
neighbour it meant to reach).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import ipaddress
import os
import pathlib
import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, x25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NODE_URI_PREFIX = "hushnet://node/"
OPERATOR_URI_PREFIX = "hushnet://operator/"
BOOTSTRAP_DNS = "bootstrap.hushnet"
NODE_DNS_SUFFIX = ".node.hushnet"
NODE_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")

NODE_CERT_DAYS = 90
OPERATOR_CERT_DAYS = 365
CA_CERT_DAYS = 3650


class IdentityError(ValueError):
    """A certificate or identity that hushnet refuses."""


def valid_node_id(node_id: str) -> bool:
    """Node ids are DNS labels (lowercase letters, digits, '-'), because they appear in a DNS SAN."""
    return bool(NODE_ID_RE.match(node_id))


def node_dns(node_id: str) -> str:
    """DNS SAN that a client pins when it dials node ``node_id``."""
    return f"{node_id}{NODE_DNS_SUFFIX}"


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


# --------------------------------------------------------------------------- keys


def generate_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-256 key (TLS identity)."""
    return ec.generate_private_key(ec.SECP256R1())


def key_to_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise IdentityError("expected an ECDSA private key")
    return key


def generate_x25519() -> x25519.X25519PrivateKey:
    """Long-term X25519 key (published in the directory; used later for onion layers)."""
    return x25519.X25519PrivateKey.generate()


def x25519_to_bytes(key: x25519.X25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def x25519_public_bytes(key: x25519.X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def write_secret(path: pathlib.Path, data: bytes) -> None:
    """Write a private file (mode 0600) atomically."""
    path = pathlib.Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def write_public(path: pathlib.Path, data: bytes) -> None:
    path = pathlib.Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- certificates


def cert_to_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def load_cert(pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise IdentityError(f"not a PEM certificate: {exc}") from exc


def cert_sha256(cert: x509.Certificate | bytes) -> str:
    """Hex SHA-256 of the DER certificate (the 'certificate fingerprint')."""
    if isinstance(cert, (bytes, bytearray)):
        cert = load_cert(bytes(cert))
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def key_sha256(public_key) -> str:
    """Hex SHA-256 of a DER SubjectPublicKeyInfo: stable across certificate renewals."""
    der = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def _uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


@dataclass(frozen=True)
class PeerIdentity:
    """Who is at the other end of a TLS connection, as proven by its certificate."""

    kind: str  # "node" | "operator"
    name: str  # node id or operator name

    @property
    def is_node(self) -> bool:
        return self.kind == "node"

    @property
    def is_operator(self) -> bool:
        return self.kind == "operator"

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def identity_from_uris(uris: list[str]) -> PeerIdentity | None:
    """The hushnet identity named by a list of SAN URIs (exactly one must be ours)."""
    found: list[PeerIdentity] = []
    for uri in uris:
        if uri.startswith(NODE_URI_PREFIX):
            found.append(PeerIdentity("node", uri[len(NODE_URI_PREFIX) :]))
        elif uri.startswith(OPERATOR_URI_PREFIX):
            found.append(PeerIdentity("operator", uri[len(OPERATOR_URI_PREFIX) :]))
    if len(found) != 1:
        return None
    return found[0]


def identity_of(cert: x509.Certificate) -> PeerIdentity | None:
    return identity_from_uris(_uris(cert))


def create_ca(
    common_name: str = "hushnet network CA",
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA (path length 0: it signs leaf certificates only)."""
    key = generate_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=CA_CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_csr(key: ec.EllipticCurvePrivateKey, common_name: str = "hushnet node") -> bytes:
    """A PKCS#10 request; the bootstrap ignores its subject and only uses the key."""
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def load_csr(pem: bytes) -> x509.CertificateSigningRequest:
    """Parse a CSR and check its self-signature (proof that the requester holds the key)."""
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError as exc:
        raise IdentityError(f"malformed certificate request: {exc}") from exc
    if not csr.is_signature_valid:
        raise IdentityError("certificate request signature is invalid")
    if not isinstance(csr.public_key(), ec.EllipticCurvePublicKey):
        raise IdentityError("certificate request must carry an ECDSA P-256 key")
    if csr.public_key().curve.name != "secp256r1":
        raise IdentityError("certificate request must carry an ECDSA P-256 key")
    return csr


def issue_cert(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    public_key,
    *,
    kind: str,
    name: str,
    dns_names: list[str] = (),
    ips: list[str] = (),
    days: float = NODE_CERT_DAYS,
    not_before: _dt.datetime | None = None,
) -> x509.Certificate:
    """Sign a leaf certificate naming ``kind``/``name`` in a SAN URI.

    Node certificates are usable as TLS server and client; operator certificates as client only.
    """
    if kind == "node":
        uri = NODE_URI_PREFIX + name
        eku = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    elif kind == "operator":
        uri = OPERATOR_URI_PREFIX + name
        eku = [ExtendedKeyUsageOID.CLIENT_AUTH]
    elif kind == "bootstrap":
        uri = "hushnet://bootstrap/" + name
        eku = [ExtendedKeyUsageOID.SERVER_AUTH]
    else:
        raise ValueError(f"unknown certificate kind {kind!r}")
    start = not_before or (_now() - _dt.timedelta(minutes=5))
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
    sans += [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{kind}:{name}")]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    return builder.sign(ca_key, hashes.SHA256())


# --------------------------------------------------------------------------- gRPC glue


def server_credentials(
    key_pem: bytes, cert_pem: bytes, ca_pem: bytes, *, require_client_auth: bool = True
):
    """TLS server credentials that only accept clients whose certificate chains to ``ca_pem``."""
    import grpc

    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=require_client_auth
    )


def channel_credentials(ca_pem: bytes, key_pem: bytes | None = None, cert_pem: bytes | None = None):
    """TLS client credentials presenting our certificate (mutual TLS) and trusting only ``ca_pem``."""
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
    )


def peer_identity(context) -> PeerIdentity | None:
    """The hushnet identity of the caller of a gRPC handler, from ``context.auth_context()``.

    gRPC exposes the verified client certificate as ``x509_pem_cert`` and its SANs as
    ``x509_subject_alternative_name``; we parse the PEM ourselves so that the URI SAN (not a
    DNS or IP SAN that happens to look alike) decides the identity.
    """
    auth = context.auth_context() or {}
    pems = auth.get("x509_pem_cert") or []
    if not pems:
        return None
    try:
        cert = x509.load_pem_x509_certificate(pems[0])
    except ValueError:
        return None
    return identity_of(cert)


def peer_cert_sha256(context) -> str | None:
    """Fingerprint of the caller's certificate, or None on a connection without one."""
    auth = context.auth_context() or {}
    pems = auth.get("x509_pem_cert") or []
    if not pems:
        return None
    return cert_sha256(pems[0])


# --------------------------------------------------------------------------- signed requests


def signed_message(method: str, node_id: str, unix_ms: int) -> bytes:
    """The bytes a member signs to authenticate a Heartbeat/Leave to the bootstrap.

    Why not mutual TLS: the bootstrap must also serve nodes that have no certificate yet
    (Join), and gRPC's Python server cannot *optionally* verify client certificates; a
    signature with the certificate key proves the same possession.
    """
    return f"hushnet.v1|{method}|{node_id}|{unix_ms}".encode()


def host_lease_message(node_ids: list[str], host_sha: str, unix_ms: int) -> bytes:
    """What a host process signs to renew its nodes' leases in one HeartbeatHost (binds the exact node list;
    ``host_sha`` is the hex SHA-256 of the host key's DER)."""
    import hashlib

    digest = hashlib.sha256("\n".join(node_ids).encode()).hexdigest()
    return signed_message(f"HeartbeatHost:{digest}", host_sha, unix_ms)


def sign(key: ec.EllipticCurvePrivateKey, message: bytes) -> bytes:
    return key.sign(message, ec.ECDSA(hashes.SHA256()))


def verify(cert: x509.Certificate, message: bytes, signature: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        cert.public_key().verify(signature, message, ec.ECDSA(hashes.SHA256()))
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


def public_key_der(key: ec.EllipticCurvePrivateKey) -> bytes:
    """DER SubjectPublicKeyInfo of ``key``'s public half (a host process's lease key, see HostHeartbeat)."""
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_public_key_der(der: bytes) -> ec.EllipticCurvePublicKey:
    """Parse a DER SubjectPublicKeyInfo; only ECDSA P-256 keys are accepted (clear error otherwise)."""
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_der_public_key(bytes(der))
    except ValueError as exc:
        raise IdentityError(f"malformed public key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise IdentityError("public key must be ECDSA P-256")
    return key


def verify_key(public_key: ec.EllipticCurvePublicKey, message: bytes, signature: bytes) -> bool:
    """:func:`verify` against a bare public key."""
    from cryptography.exceptions import InvalidSignature

    try:
        public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` → (host, port), with a clear error for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 <= int(port) < 65536):
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
