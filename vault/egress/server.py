"""The proxy process: mitmproxy with the Egress addon, the control endpoint, and the CA bundle for sandboxes.

Loaded by `__main__` after Django is set up (it imports the models).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from mitmproxy import options
from mitmproxy.addons import core, disable_h2c, errorcheck, next_layer, proxyserver, tlsconfig
from mitmproxy.master import Master

from sandboxes.provisioning import egress_bundle, egress_gateway
from vault import crypto

from .addon import Egress
from .control import Control
from .door import Door
from .notices import Notices
from .policy import private_allowed
from .resolver import Resolver
from .state import Auditor, Keys, Loader, Policies

logger = logging.getLogger("vault.egress")
CA_CERT = "mitmproxy-ca-cert.pem"


def write_bundle(confdir: Path) -> Path:
    """The bundle sandboxes trust: the system's CAs and the proxy's own, replaced atomically."""
    ours = (confdir / CA_CERT).read_text()
    try:
        system = Path(settings.EGRESS_SYSTEM_CA_FILE).read_text()
    except OSError:
        logger.warning(
            "egress: no system CA bundle at %s; sandboxes trust only the proxy's CA",
            settings.EGRESS_SYSTEM_CA_FILE,
        )
        system = ""
    bundle = egress_bundle()
    crypto.write_atomically(bundle, system.rstrip("\n") + "\n" + ours, 0o644)
    return bundle


def wait_for_address(host: str, port: int) -> None:
    """The proxy listens on the sandboxes' bridge, which exists once the network does (the docker provider
    or `python -m vault.egress network` makes it): wait for it rather than fail."""
    said = False
    while True:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
                return
            except OSError as error:
                if error.errno != 99:  # EADDRNOTAVAIL: the bridge is not there yet
                    raise SystemExit(f"egress: cannot listen on {host}:{port}: {error.strerror}") from None
        if not said:
            logger.warning(
                "egress: waiting for %s (the sandboxes' network %s) to exist; `python -m vault.egress network` "
                "makes it",
                host,
                settings.EGRESS_NETWORK,
            )
            said = True
        time.sleep(1.0)


async def serve(*, listen_host: str | None = None) -> None:
    host = listen_host or egress_gateway()
    port = settings.EGRESS_PORT
    confdir = Path(settings.EGRESS_DATA_DIR)
    confdir.mkdir(parents=True, exist_ok=True)
    os.chmod(confdir, 0o700)
    keys = Keys()
    keys.ring()  # fail now, not at the first request, without the key
    await asyncio.to_thread(wait_for_address, host, port)

    loop = asyncio.get_running_loop()
    resolver = Resolver(loop, private_allowed(settings.EGRESS_PRIVATE_ALLOWED))
    resolver.install(loop)
    auditor = Auditor()
    policies = Policies(Loader(keys), ttl=settings.EGRESS_CACHE_SECONDS)
    notices = Notices(loop, policies.notice) if Notices.available() else None
    if notices is not None:
        notices.start()
    else:
        logger.info(
            "egress: the database sends no notices (not PostgreSQL): a changed policy is used within "
            "EGRESS_CACHE_SECONDS (%s s)",
            settings.EGRESS_CACHE_SECONDS,
        )
    door = None
    modes = [f"regular@{host}:{port}"]
    if settings.EGRESS_HARNESS_LISTEN:
        door_host, _, door_port = settings.EGRESS_HARNESS_LISTEN.rpartition(":")
        door = Door(
            spec=f"regular@{door_host or '127.0.0.1'}:{int(door_port)}",
            token=settings.EGRESS_HARNESS_TOKEN,
            sandbox_subnet=settings.EGRESS_SUBNET,
            policies=policies,
            resolver=resolver,
            keys=keys,
            ca_file=settings.EGRESS_UPSTREAM_CA,
            refresh_margin=settings.EGRESS_REFRESH_MARGIN_SECONDS,
        )
        modes.append(door.spec)
        if not settings.EGRESS_HARNESS_TOKEN:
            logger.warning("egress: EGRESS_HARNESS_TOKEN is not set: the workers' door refuses every request")
    egress = Egress(
        policies,
        resolver,
        auditor,
        repository_plain_hosts=list(settings.REPOSITORY_PLAIN_HOSTS),
        buffer_bytes=settings.EGRESS_BUFFER_BYTES,
        door=door,
    )
    opts = options.Options(mode=modes, confdir=str(confdir))
    master = Master(opts)
    # Only what proxying needs: each addon more is one more call on every event of every flow (mitmproxy's
    # ~30 default addons doubled the latency it adds), and some would answer requests themselves (its
    # onboarding app, its replay and map-local features).
    master.addons.add(
        core.Core(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        disable_h2c.DisableH2C(),
        errorcheck.ErrorCheck(),
        egress,
    )
    opts.update(
        connection_strategy="lazy",  # no upstream connection before the request is checked
        upstream_cert=False,  # certificates for sandboxes from the name they asked for, without a connection
        **(
            {"ssl_verify_upstream_trusted_ca": settings.EGRESS_UPSTREAM_CA}
            if settings.EGRESS_UPSTREAM_CA
            else {}
        ),
    )
    started = time.time()

    def health() -> dict[str, Any]:
        return {
            "listening": f"{host}:{port}",
            "workers_door": settings.EGRESS_HARNESS_LISTEN if door else None,
            "uptime_s": round(time.time() - started, 1),
            # "listening": a changed policy is used at its commit; otherwise within EGRESS_CACHE_SECONDS.
            "policy_notices": notices.state if notices is not None else "none (not PostgreSQL)",
        }

    control = (
        Control(
            settings.EGRESS_CONTROL_URL,
            token=settings.EGRESS_CONTROL_TOKEN,
            health=health,
            validate=door.validate if door else None,
        )
        if (settings.EGRESS_CONTROL_URL)
        else None
    )
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, master.shutdown)
    runner = asyncio.create_task(master.run())
    # mitmproxy makes its CA when it configures (before it listens); the bundle follows it.
    while not (confdir / CA_CERT).exists() and not runner.done():
        await asyncio.sleep(0.05)
    if runner.done():
        await runner
        return
    bundle = write_bundle(confdir)
    if control is not None:
        await control.start()
    logger.info("egress: proxy on %s:%s; sandboxes trust %s", host, port, bundle)
    try:
        await runner
    finally:
        if control is not None:
            await control.close()
        auditor.close()
        if notices is not None:
            notices.close()
