"""The bootstrap's certificate authority and its files in the state directory.

On first start the authority creates: the CA key and certificate, the bootstrap's own TLS
server certificate, an **operator** certificate (for the CLI and later the notebook client)
and a join token. Later starts load the same files, so node certificates issued before a
restart stay valid.

State directory layout::

    ca.key  ca.pem            network CA (key 0600)
    server.key  server.pem    bootstrap TLS server identity (DNS bootstrap.hushnet)
    operator.key operator.pem operator client identity (hushnet://operator/<name>)
    join_token                shared secret that nodes present to join (0600)
    bootstrap.sqlite          membership and topology (see :mod:`hushnet.bootstrap.store`)
"""

from __future__ import annotations

import datetime as _dt
import pathlib
import secrets
from dataclasses import dataclass

from cryptography import x509

from hushnet.net import pki


@dataclass
class Authority:
    state_dir: pathlib.Path
    ca_key: object
    ca_cert: x509.Certificate
    token: str

    @property
    def ca_pem(self) -> bytes:
        return pki.cert_to_pem(self.ca_cert)

    def issue_node_cert(
        self, public_key, node_id: str, host: str | None, days: float = pki.NODE_CERT_DAYS
    ) -> x509.Certificate:
        """Certificate for node ``node_id`` (SAN URI + pinned DNS name + IP when ``host`` is one)."""
        ips = [host] if host and pki.is_ip(host) else []
        dns = [pki.node_dns(node_id)]
        if host and not pki.is_ip(host):
            dns.append(host)
        return pki.issue_cert(
            self.ca_key,
            self.ca_cert,
            public_key,
            kind="node",
            name=node_id,
            dns_names=dns,
            ips=ips,
            days=days,
        )

    def server_files(self) -> tuple[bytes, bytes]:
        return (self.state_dir / "server.key").read_bytes(), (
            self.state_dir / "server.pem"
        ).read_bytes()


def load_or_create(
    state_dir: pathlib.Path, token: str | None = None, operator_name: str = "admin"
) -> Authority:
    """Load the authority from ``state_dir``, creating every missing piece on first start.

    ``token``: if given it becomes (or replaces) the join token; otherwise an existing token is
    kept or a random one created.
    """
    state_dir = pathlib.Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    ca_key_path, ca_path = state_dir / "ca.key", state_dir / "ca.pem"
    if ca_key_path.exists() and ca_path.exists():
        ca_key = pki.load_key(ca_key_path.read_bytes())
        ca_cert = pki.load_cert(ca_path.read_bytes())
    else:
        ca_key, ca_cert = pki.create_ca()
        pki.write_secret(ca_key_path, pki.key_to_pem(ca_key))
        pki.write_public(ca_path, pki.cert_to_pem(ca_cert))

    server_key_path, server_path = state_dir / "server.key", state_dir / "server.pem"
    if not _valid_for(server_path, days=7):
        key = pki.generate_key()
        cert = pki.issue_cert(
            ca_key,
            ca_cert,
            key.public_key(),
            kind="bootstrap",
            name="bootstrap",
            dns_names=[pki.BOOTSTRAP_DNS, "localhost"],
            days=365,
        )
        pki.write_secret(server_key_path, pki.key_to_pem(key))
        pki.write_public(server_path, pki.cert_to_pem(cert))

    op_key_path, op_path = state_dir / "operator.key", state_dir / "operator.pem"
    if not _valid_for(op_path, days=7):
        key = pki.generate_key()
        cert = pki.issue_cert(
            ca_key,
            ca_cert,
            key.public_key(),
            kind="operator",
            name=operator_name,
            days=pki.OPERATOR_CERT_DAYS,
        )
        pki.write_secret(op_key_path, pki.key_to_pem(key))
        pki.write_public(op_path, pki.cert_to_pem(cert))

    token_path = state_dir / "join_token"
    if token:
        pki.write_secret(token_path, token.encode())
    elif not token_path.exists():
        pki.write_secret(token_path, secrets.token_urlsafe(24).encode())
    return Authority(state_dir, ca_key, ca_cert, token_path.read_text().strip())


def _valid_for(path: pathlib.Path, days: float) -> bool:
    if not path.exists():
        return False
    try:
        cert = pki.load_cert(path.read_bytes())
    except pki.IdentityError:
        return False
    remaining = cert.not_valid_after_utc - _dt.datetime.now(_dt.timezone.utc)
    return remaining > _dt.timedelta(days=days)
