"""Local servers the egress tests talk to through the proxy: a TLS CA made for the run, and an HTTPS server
that echoes each request's headers and body back (what a hostile host that wants the secret would do)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class TestCA:
    ca_file: Path
    cert_file: Path
    key_file: Path


def make_ca(folder: Path, addresses: list[str]) -> TestCA:
    """A CA and a server certificate for `addresses` (IPs), signed by it."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "workbench egress test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, addresses[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    made = TestCA(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    made.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    made.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    made.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return made


WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


@dataclass
class EchoServer:
    host: str
    port: int = 0
    # What each request carried when it arrived (after the proxy): (path, headers, body).
    seen: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"


def _handler(server: EchoServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # One write per response, sent at once: no 40 ms wait on a delayed ACK between header and body.
        wbufsize = 1 << 16
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _websocket(self) -> None:
            """A WebSocket that sends one message, the JSON of the handshake's headers, and closes."""
            accept = base64.b64encode(
                hashlib.sha1((self.headers["Sec-WebSocket-Key"] + WEBSOCKET_GUID).encode()).digest()
            ).decode()
            headers = {k: v for k, v in self.headers.items()}
            server.seen.append((self.path, headers, b""))
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.end_headers()
            payload = json.dumps({"headers": headers}).encode()
            length = len(payload)
            head = bytes([0x81, length]) if length < 126 else bytes([0x81, 126]) + length.to_bytes(2, "big")
            self.wfile.write(head + payload + bytes([0x88, 0]))
            self.wfile.flush()
            self.close_connection = True

        def _echo(self) -> None:
            if self.headers.get("Upgrade", "").lower() == "websocket":
                self._websocket()
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items()}
            server.seen.append((self.path, headers, body))
            reply = json.dumps(
                {"path": self.path, "headers": headers, "body": body.decode("utf-8", "replace")}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            # Echoed in a response header too.
            self.send_header("X-Echo-Authorization", headers.get("Authorization", ""))
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        do_GET = _echo
        do_POST = _echo

    return Handler


@contextmanager
def echo_server(host: str, ca: TestCA) -> Iterator[EchoServer]:
    server = EchoServer(host)
    httpd = ThreadingHTTPServer((host, 0), _handler(server))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca.cert_file, ca.key_file)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, name=f"echo-{host}", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
