#!/usr/bin/env python3
"""Make a cluster's certificates and its first SCRAM user: docker-compose.yml's one-shot
``security-init`` service runs this before any broker starts.

    python deploy/init_security.py --pki-dir DIR [--ca-dir DIR] --broker 1=broker-1,localhost ... \\
        [--zookeeper zk1:2181/tidelog --user admin] [--client-properties DIR/client.properties]

1. **Certificates** (``broker.security.certificates.make_cluster_pki``), made in ``--ca-dir``:
   ``ca.pem`` and its key ``ca-key.pem`` (made once, then reused), and ``broker-<id>.pem``
   (certificate and key) for each ``--broker ID=NAME[,NAME...]``, naming those host names
   and addresses. A broker's certificate is kept while the CA signed it, it names every
   name asked for and it is valid for another ``RENEW_DAYS``; else it is made again (a new
   broker, a name added such as ``TIDELOG_ADVERTISED_HOST``, an expiry ahead). Then
   ``ca.pem`` and the broker files are copied to ``--pki-dir``, what the brokers mount: the
   CA's key stays in ``--ca-dir`` (default: the same directory). Private keys are written
   readable by their owner only, and only there: in compose named volumes, never the
   repository or the image.
2. **The user** (``--user``, password from the environment variable ``--password-env``,
   default ``TIDELOG_ADMIN_PASSWORD``): SCRAM-SHA-256 and SCRAM-SHA-512 credentials written
   straight into ZooKeeper (``tidelog configs --zookeeper``), since no client can
   authenticate, and no broker reach another, before they exist. Every run sets them again,
   so the password in the environment is always the one that works: changing it and running
   this again changes the user's password.
3. **``--client-properties FILE``**: the user's ``--command-config`` file for the command-line
   tools (``security.protocol``, ``sasl.*``, ``ssl.ca.location``), owner-readable only.

Running it again changes nothing that is still right; exit status 0 when done, 1 when
ZooKeeper refused, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if (ROOT / "broker" / "security").is_dir():  # a checkout; in the image tidelog is installed
    sys.path.insert(0, str(ROOT))

from cryptography import x509  # noqa: E402
from cryptography.exceptions import InvalidSignature  # noqa: E402

from tidelog.broker.security.certificates import make_cluster_pki  # noqa: E402
from tidelog.broker.security.entity_configs import set_scram_password  # noqa: E402
from tidelog.protocol.errors import TidelogError  # noqa: E402

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
CLIENT_MECHANISM = "SCRAM-SHA-512"
RENEW_DAYS = 30
# `tidelog configs --add-config` brackets the password, so it cannot hold "," or "]"; the
# brokers' sasl.jaas.config quotes it, so no '"' or "\" either.
_PASSWORD = re.compile(r'[^,\]"\\\s]{8,}')


def parse_broker(text: str) -> tuple[int, list[str]]:
    """``"1=broker-1,localhost"`` -> (1, ["broker-1", "localhost"]); empty names dropped."""
    broker_id, sep, names = text.partition("=")
    if not sep or not broker_id.strip().isdigit():
        raise ValueError(f"--broker {text!r}: expected ID=NAME[,NAME...], e.g. 1=broker-1,localhost")
    found = [n.strip() for n in names.split(",") if n.strip()]
    if not found:
        raise ValueError(f"--broker {text!r}: no host name")
    return int(broker_id), found


def stale_brokers(directory: Path, brokers: Mapping[int, Iterable[str]],
                  now: datetime.datetime | None = None) -> dict[int, list[str]]:
    """The brokers whose certificate must be made (again): missing, not signed by the CA in
    ``directory``, missing a name, or expiring within RENEW_DAYS. Without a CA: all."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    ca_path = directory / "ca.pem"
    if not (ca_path.exists() and (directory / "ca-key.pem").exists()):
        return {i: list(names) for i, names in brokers.items()}
    ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    out = {}
    for broker_id, names in brokers.items():
        path = directory / f"broker-{broker_id}.pem"
        if not path.exists() or not _still_good(path, ca, set(names), now):
            out[broker_id] = list(names)
    return out


def _still_good(path: Path, ca: x509.Certificate, names: set[str], now: datetime.datetime) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):  # unreadable, or another CA's: make it again
        return False
    return names <= certificate_names(cert) and cert.not_valid_after_utc - now > datetime.timedelta(days=RENEW_DAYS)


def certificate_names(cert: x509.Certificate) -> set[str]:
    """The DNS names and IP addresses a certificate's subjectAltName lists, as text."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName)) | {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def make_certificates(ca_dir: Path, brokers: Mapping[int, Iterable[str]], pki_dir: Path | None = None) -> list[int]:
    """Step 1: the CA and the broker certificates that are not right yet, in ``ca_dir``; then
    ``ca.pem`` and every broker's file copied to ``pki_dir`` (if another directory). Returns
    the ids of the brokers whose certificate was made."""
    stale = stale_brokers(ca_dir, brokers)
    if stale or not (ca_dir / "ca.pem").exists():
        make_cluster_pki(ca_dir, stale)
    if pki_dir is not None and pki_dir.resolve() != ca_dir.resolve():
        pki_dir.mkdir(parents=True, exist_ok=True)
        for name in ["ca.pem", *(f"broker-{i}.pem" for i in sorted(brokers))]:
            data = (ca_dir / name).read_text()
            if not (pki_dir / name).exists() or (pki_dir / name).read_text() != data:
                write_private(pki_dir / name, data, 0o644 if name == "ca.pem" else 0o600)
    return sorted(stale)


def create_user(zookeeper: str, user: str, password: str) -> None:
    """Step 2: the user's SCRAM credentials, straight into ZooKeeper, in this process (the
    password never appears in a command line); raises ValueError or a ZooKeeper error."""
    set_scram_password(zookeeper, user, password)


def client_properties(ca: Path, user: str, password: str) -> str:
    return (f"# {user}'s settings for the tidelog tools: tidelog ... --command-config <this file>\n"
            f"security.protocol=SASL_SSL\nsasl.mechanism={CLIENT_MECHANISM}\n"
            f"sasl.username={user}\nsasl.password={password}\nssl.ca.location={ca}\n")


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``text`` (by default readable by its owner only), replacing the file whole."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pki-dir", required=True, type=Path,
                    help="where the brokers find ca.pem and broker-<id>.pem (what they mount)")
    ap.add_argument("--ca-dir", type=Path, help="where the CA and its key live (default: --pki-dir)")
    ap.add_argument("--broker", action="append", default=[], metavar="ID=NAME[,NAME...]",
                    help="a broker and the host names and addresses its certificate names (repeatable)")
    ap.add_argument("--zookeeper", metavar="HOST:PORT[,...][/CHROOT]",
                    help="create --user's SCRAM credentials in this ZooKeeper (chroot default /tidelog)")
    ap.add_argument("--user", default="admin", help="the user to create (default admin)")
    ap.add_argument("--password-env", default="TIDELOG_ADMIN_PASSWORD", metavar="VAR",
                    help="the environment variable holding the user's password (default TIDELOG_ADMIN_PASSWORD)")
    ap.add_argument("--client-properties", type=Path, metavar="FILE",
                    help="write the user's --command-config file here")
    args = ap.parse_args(argv)
    try:
        brokers = dict(parse_broker(b) for b in args.broker)
    except ValueError as e:
        ap.error(str(e))
    password = os.environ.get(args.password_env, "")
    if (args.zookeeper or args.client_properties) and not _PASSWORD.fullmatch(password):
        ap.error(f"{args.password_env} must hold the password of {args.user}: at least 8 characters, "
                 "none of them blank, ',', ']', '\"' or '\\'")
    made = make_certificates(args.ca_dir or args.pki_dir, brokers, args.pki_dir)
    print(f"{args.pki_dir}: CA ca.pem; certificates made for brokers {made or 'none (all still good)'}", flush=True)
    if args.zookeeper:
        try:
            create_user(args.zookeeper, args.user, password)
        except (ValueError, OSError, TidelogError) as e:
            print(f"init_security: setting the SCRAM credentials of {args.user} failed: {e}", file=sys.stderr)
            return 1
        print(f"user {args.user}: {' and '.join(SCRAM_MECHANISMS)} credentials set in {args.zookeeper}", flush=True)
    if args.client_properties:
        write_private(args.client_properties, client_properties(args.pki_dir / "ca.pem", args.user, password))
        print(f"{args.client_properties}: --command-config for {args.user}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
