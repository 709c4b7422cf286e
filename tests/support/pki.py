"""A throwaway certificate authority for tests: server certificates for loopback and client certificates."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


class CertificateAuthority:
    """Writes ca.crt / ca.key under `directory` and issues certificates signed by it."""

    def __init__(self, directory: Path, name: str = "koord-recommender test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = directory / "ca.crt"
        self.cert_path.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))
        (directory / "ca.key").write_bytes(_pem_key(self.key))

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        name: str,
        *,
        common_name: str,
        organizations: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        client: bool = False,
    ) -> Issued:
        key = _key()
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client else x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
        )
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns] + [
            x509.IPAddress(ipaddress.ip_address(i)) for i in ips
        ]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(_pem_key(key))
        return issued


def service_account_keys(directory: Path) -> tuple[Path, Path]:
    """RSA key pair that signs and verifies service account tokens."""
    key = _key()
    private, public = directory / "sa.key", directory / "sa.pub"
    private.write_bytes(_pem_key(key))
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public
