"""A private CA and broker certificates, made on the spot for a dev or compose cluster.

``tidelog dev up --security SASL_SSL`` and ``deploy/make-certs`` call ``make_cluster_pki``:
a CA (``ca.pem``, and its key ``ca-key.pem``, kept only to sign more brokers later) and one
PEM keystore per broker (``broker-<id>.pem``: its certificate, signed by the CA, then its
private key), each naming the host names and addresses the broker is reached at. Keys are
EC P-256, certificates valid for ``VALID_DAYS``; files holding a private key are written
readable by their owner only. Nothing here is meant for production: operators bring their
own certificates (docs/operations.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 825


def make_cluster_pki(directory: str | os.PathLike, brokers: Mapping[int, Iterable[str]],
                     *, organization: str = "Tidelog dev cluster") -> Path:
    """Write ``ca.pem`` and ``broker-<id>.pem`` (for the names given per broker id) into
    ``directory``, reusing a CA already there; returns the CA certificate's path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _ca(root, organization)
    for broker_id, names in brokers.items():
        cert, key = _issue(ca_cert, ca_key, f"broker-{broker_id}", list(names), organization)
        _write_private(root / f"broker-{broker_id}.pem", _pem(cert) + _key_pem(key))
    return root / "ca.pem"


def _ca(root: Path, organization: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = root / "ca.pem", root / "ca-key.pem"
    if cert_path.exists() and key_path.exists():
        return (x509.load_pem_x509_certificate(cert_path.read_bytes()),
                serialization.load_pem_private_key(key_path.read_bytes(), password=None))
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"{organization} CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_private(key_path, _key_pem(key))
    cert_path.write_bytes(_pem(cert))
    return cert, key


def _issue(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, common_name: str,
           names: list[str], organization: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    alt_names: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
                                     x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
