"""The latency the egress proxy adds: to a sandbox's HTTPS request and to an MCP call, each against the same
call made directly, side by side in one run (target: at most 5 ms added at p50).

    .venv/bin/python -m bench.egress [--quick] [--rounds 20] [--batch 25] [--mcp-calls 300]

Prints a table and writes bench/results/egress.json and egress.png (egress-quick.* with --quick).

- **A sandbox's HTTPS GET** to a local HTTPS server (tests/vault/egress/servers.py's echoing server, with a
  CA made for the run), timed inside the container by one Python client (http.client): *through the proxy*
  from a sandbox the platform provisions (`sandbox_provision`, SANDBOX_EGRESS on: the egress network, its
  HTTPS_PROXY with the sandbox's identity, the proxy's CA bundle), and *directly* from a second container of
  the same image, provisioned by the same provider with the same limits, mount and DNS, on an internal
  network of its own whose gateway is the server's address, without a proxy. Three cases: keep-alive (one
  tunnel or connection, its first request not timed), a new connection for each request (a CONNECT and two
  TLS handshakes through the proxy, one directly), and keep-alive with an `environment_variable` placeholder
  in a header, which the proxy substitutes (and scrubs from the echoed answer). Batches alternate: the
  proxied side's, then the direct side's, round after round.
- **An MCP call**: `harness.mcp.call_tool` (the whole call: a new MCP session over streamable HTTP, six
  HTTP requests from initialize to the session's DELETE) of a local MCP server's `echo` tool (the `mcp`
  SDK under uvicorn in a process of its own), alternating call by call: *through the proxy's workers'
  door* (EGRESS_HARNESS_URL) to the server's listener that requires a bearer token, which the proxy adds
  from a `static_bearer` credential in the session's vault; and *directly* (EGRESS_HARNESS_URL empty) to
  the same server's second listener, which checks no token.

Everything is local and removed at the end, on Ctrl-C too: PostgreSQL and Redis of the run's own, the proxy
(`python -m vault.egress` from .venv-egress, with a private keyring), its Docker network and firewall rules,
the direct side's network, the containers (labelled workbench.deployment=bench-egress). Traffic goes only to
loopback, the host's addresses on those two networks, and the containers made here. Needs root (iptables),
Docker and the sandbox image.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import random
import secrets
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/egress.py` as well as `-m`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT  # noqa: E402
from bench.common.launcher import Launcher, service_arguments  # noqa: E402
from bench.common.machine import load_average, machine_info, warn_if_busy  # noqa: E402
from bench.common.processes import Failed, Processes, free_port, wait_until  # noqa: E402
from bench.common.results import percentile, publish, pyplot, run, save_figure, say, stem  # noqa: E402
from tests.vault.egress.servers import EchoServer, echo_server, make_ca  # noqa: E402

DEPLOYMENT = "bench-egress"
EGRESS_PYTHON = ROOT / ".venv-egress" / "bin" / "python"
MCP_HOST = "127.0.0.3"  # loopback, but not the address the host's own services listen on
TOKEN_NAME = "BENCH_TOKEN"  # the environment_variable credential's secret_name
TARGET_ADDED_P50_MS = 5.0


@dataclass(frozen=True)
class Plan:
    rounds: int  # HTTPS: batches per side and case, the two sides taking turns
    batch: int  # HTTPS: timed requests per batch
    mcp_calls: int  # MCP: timed calls per side, the two sides taking turns
    warmup: int  # HTTPS: untimed rounds first
    mcp_warmup: int  # MCP: untimed calls per side first


DEFAULT = Plan(rounds=20, batch=25, mcp_calls=300, warmup=2, mcp_warmup=10)
QUICK = Plan(rounds=2, batch=5, mcp_calls=10, warmup=1, mcp_warmup=2)

# The client, inside a container: the same code on both sides; the proxied side finds its proxy (and its
# identity) in HTTPS_PROXY, as any client there does. Header values may name the shell's variables ($NAME).
CLIENT = r"""
import base64, http.client, json, os, ssl, sys, time
from urllib.parse import unquote, urlsplit
mode, url, count = sys.argv[1], urlsplit(sys.argv[2]), int(sys.argv[3])
headers = dict(os.path.expandvars(h).split(": ", 1) for h in sys.argv[4:])
proxy = urlsplit(os.environ["HTTPS_PROXY"]) if os.environ.get("HTTPS_PROXY") else None
context = ssl.create_default_context()
def connect():
    if proxy is None:
        return http.client.HTTPSConnection(url.hostname, url.port, context=context, timeout=30)
    conn = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=30)
    identity = base64.b64encode(f"{unquote(proxy.username)}:{unquote(proxy.password)}".encode()).decode()
    conn.set_tunnel(url.hostname, url.port, headers={"Proxy-Authorization": "Basic " + identity})
    return conn
def get(conn):
    conn.request("GET", url.path, headers=headers)
    answer = conn.getresponse()
    return answer.status, answer.read()
timings, statuses, body = [], set(), b""
conn = connect()
if mode == "keepalive":
    statuses.add(get(conn)[0])  # opens the connection (and the tunnel): not timed
for _ in range(count):
    started = time.perf_counter()
    if mode == "new":
        conn = connect()
    status, body = get(conn)
    if mode == "new":
        conn.close()
    timings.append((time.perf_counter() - started) * 1000)
    statuses.add(status)
conn.close()
answer = {"ms": timings, "statuses": sorted(statuses), "body": body.decode("utf-8", "replace")}
print("RESULT " + json.dumps(answer))
"""


@dataclass
class Case:
    """One HTTPS measurement: the client's mode, a path of its own, the sandbox that sends it through the
    proxy, and its headers."""

    key: str
    measurement: str
    mode: str
    proxied: str  # the handle of the proxied sandbox it runs in
    headers: tuple[str, ...] = ()


@dataclass
class Rig:
    """What the measurements run against (see `rig`)."""

    provider: Any
    echo: EchoServer
    plain: str  # a sandbox through the proxy whose session holds no credential
    vaulted: str  # a sandbox through the proxy whose session's vault has an environment_variable credential
    direct: str  # the container without a proxy
    secret: str
    placeholder: str
    mcp_session: str
    mcp_credential: str  # the static_bearer credential's id
    mcp_guarded: str  # the MCP server's URL that requires the bearer token
    mcp_open: str  # the same server's URL that requires none
    door: dict[str, Any]  # the harness's settings for the workers' door


# -- the setup


def free_subnets(count: int) -> list[str]:
    """/24s under 10.215.0.0/16 that no Docker network or route of this machine uses."""
    import docker

    taken = []
    for network in docker.from_env(version="auto").api.networks():
        for pool in (network.get("IPAM") or {}).get("Config") or []:
            if pool.get("Subnet") and ":" not in pool["Subnet"]:
                taken.append(ipaddress.ip_network(pool["Subnet"]))
    for word in subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout.split():
        if "/" in word:
            with contextlib.suppress(ValueError):
                taken.append(ipaddress.ip_network(word, strict=False))
    found: list[str] = []
    start = random.randrange(200)
    for i in range(200):
        candidate = ipaddress.ip_network(f"10.215.{(start + i) % 200 + 20}.0/24")
        if not any(candidate.overlaps(other) for other in taken):
            found.append(str(candidate))
            taken.append(candidate)
            if len(found) == count:
                return found
    raise Failed("bench/egress: no free /24 under 10.215.0.0/16 for the benchmark's networks")


def gateway_of(subnet: str) -> str:
    return str(next(ipaddress.ip_network(subnet).hosts()))


def remove_firewall(bridge: str) -> None:
    """The INPUT rules the docker provider added for the bridge (sandboxes/providers/docker.py)."""
    iptables = shutil.which("iptables") or shutil.which("iptables", path="/usr/sbin:/sbin")
    if not iptables:
        return
    listed = subprocess.run([iptables, "-w", "-S", "INPUT"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        if f"-i {bridge} " in line + " ":
            subprocess.run([iptables, "-w", "-D", *line.split()[1:]], capture_output=True)


def remove_network(engine: Any, name: str) -> None:
    """The network and every container still on it."""
    import docker

    for container in engine.containers.list(all=True, filters={"network": name}):
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True, v=True)
    with contextlib.suppress(docker.errors.NotFound):
        engine.networks.get(name).remove()


def check_requirements() -> None:
    import docker

    if not EGRESS_PYTHON.exists():
        raise Failed("bench/egress: no .venv-egress: run scripts/egress-venv.sh (make test does)")
    if os.geteuid() != 0 or not (
        shutil.which("iptables") or shutil.which("iptables", path="/usr/sbin:/sbin")
    ):
        raise Failed(
            "bench/egress: needs root and iptables (the sandboxes' network is closed by INPUT rules)"
        )
    try:
        engine = docker.from_env(version="auto")
        engine.ping()
    except docker.errors.DockerException as error:
        raise Failed(
            f"bench/egress: no Docker engine ({error}); scripts/start-dockerd.sh starts one"
        ) from None
    from django.conf import settings

    try:
        engine.api.inspect_image(settings.SANDBOX_IMAGE)
    except docker.errors.ImageNotFound:
        raise Failed(
            f"bench/egress: no image {settings.SANDBOX_IMAGE}: scripts/build-image.sh builds it"
        ) from None


def wait_healthy(url: str, processes: Processes) -> None:
    def healthy() -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/healthz", timeout=1) as answer:
            return answer.status == 200
        return False

    wait_until(healthy, 60, "the egress proxy's control endpoint", processes, every=0.2)


@contextlib.contextmanager
def rig(folder: Path, *, database_url: str) -> Iterator[Rig]:
    """The proxy and both sides of every measurement, against this process's Django (its database at
    `database_url` for the proxy); everything it made is removed on the way out, however it is left."""
    import docker
    from django.conf import settings
    from django.test import override_settings

    from bench.common.app import new_agent, new_environment
    from harness.services.lifecycle import session_create
    from sandboxes.hands import sandbox_provision
    from sandboxes.providers import docker as docker_provider
    from sandboxes.providers.base import EgressRoute, Resources
    from sandboxes.provisioning import egress_route
    from vault import crypto
    from vault.services import credential_create, vault_create

    check_requirements()
    run_id = secrets.token_hex(3)
    egress_subnet, direct_subnet = free_subnets(2)
    gateway = gateway_of(direct_subnet)
    folder.mkdir(parents=True, exist_ok=True)
    ca = make_ca(folder / "tls", [gateway])
    keyring = crypto.new_key()
    keyring_file = folder / "keyring.json"
    crypto.write_atomically(keyring_file, crypto.dump(keyring), 0o600)
    harness_token = secrets.token_urlsafe(24)
    mcp_token = secrets.token_urlsafe(24)
    secret = f"bench-egress-secret-{secrets.token_hex(8)}"
    ports = {name: free_port() for name in ("proxy", "door", "control", "mcp_guarded", "mcp_open")}
    names = {
        "WORKBENCH_DEPLOYMENT": DEPLOYMENT,
        "SANDBOX_PROVIDER": "docker",
        "SANDBOX_EGRESS": True,
        "EGRESS_NETWORK": f"workbench-egress-bench-{run_id}",
        "EGRESS_BRIDGE": f"wbe-bench{run_id}",
        "EGRESS_SUBNET": egress_subnet,
        "EGRESS_PORT": ports["proxy"],
        "EGRESS_DATA_DIR": folder / "egress",
    }
    direct_network, direct_bridge = f"workbench-direct-bench-{run_id}", f"wbd-bench{run_id}"
    engine = docker.from_env(version="auto")
    stack = contextlib.ExitStack()
    with stack:
        # Undone in reverse: the processes stop, the server closes, the settings return, then this.
        stack.callback(say, f"removed the benchmark's containers, networks and firewall rules (run {run_id})")
        stack.callback(remove_firewall, names["EGRESS_BRIDGE"])
        for network in (names["EGRESS_NETWORK"], direct_network):
            stack.callback(docker_provider._prepared.discard, network)
            stack.callback(remove_network, engine, network)
        stack.enter_context(
            override_settings(
                **names,
                VAULT_PUBLIC_KEYS=crypto.dump(keyring.public()),
                VAULT_KEYS="",
                VAULT_KEY_FILE="",
                EGRESS_PLAIN_HOSTS=[MCP_HOST],
                EGRESS_HARNESS_URL="",
            )
        )
        say(f"networks: {names['EGRESS_NETWORK']} {egress_subnet}, {direct_network} {direct_subnet}")
        # The direct side's network: internal (no route out) like the sandboxes'; its gateway, the host's
        # address on it, is where the server listens.
        ipam = docker.types.IPAMConfig(
            pool_configs=[docker.types.IPAMPool(subnet=direct_subnet, gateway=gateway)]
        )
        engine.api.create_network(
            direct_network,
            driver="bridge",
            internal=True,
            ipam=ipam,
            options={
                "com.docker.network.bridge.name": direct_bridge,
                "com.docker.network.bridge.enable_ip_masquerade": "false",
            },
            labels={"workbench.deployment": DEPLOYMENT},
        )
        echo = stack.enter_context(echo_server(gateway, ca))
        processes = stack.enter_context(Processes(folder))
        provider = docker_provider.DockerProvider()
        provider.prepare_egress(egress_route())
        env = {
            **{k: str(v) for k, v in names.items()},
            "DATABASE_URL": database_url,
            "DJANGO_SETTINGS_MODULE": "workbench.settings",
            "PYTHONPATH": str(ROOT),
            "VAULT_KEY_FILE": str(keyring_file),
            "VAULT_KEYS": "",
            "EGRESS_PRIVATE_ALLOWED": f"{gateway}:{echo.port},{MCP_HOST}:{ports['mcp_guarded']}",
            "EGRESS_HARNESS_LISTEN": f"127.0.0.1:{ports['door']}",
            "EGRESS_HARNESS_TOKEN": harness_token,
            "EGRESS_UPSTREAM_CA": str(ca.ca_file),
            "EGRESS_CONTROL_URL": f"http://127.0.0.1:{ports['control']}",
            "EGRESS_CONTROL_TOKEN": secrets.token_urlsafe(16),
            "LOG_LEVEL": "WARNING",
        }
        processes.start("egress", [str(EGRESS_PYTHON), "-m", "vault.egress"], env=env)
        mcp_spec = f"{MCP_HOST}:{ports['mcp_guarded']}:{ports['mcp_open']}"
        processes.start(
            "mcp",
            [sys.executable, "-m", "bench.egress", "--serve-mcp", mcp_spec],
            env={"BENCH_MCP_TOKEN": mcp_token, "PYTHONPATH": str(ROOT)},
        )
        wait_healthy(env["EGRESS_CONTROL_URL"], processes)
        wait_until(lambda: "ready" in processes.log("mcp"), 30, "the MCP server", processes)
        say(f"egress proxy up (pid {processes.started['egress'].pid}); echo server at {echo.url}")

        agent = new_agent("bench-egress")
        environment = new_environment(
            f"bench-egress {run_id}",
            {"type": "cloud", "networking": {"type": "limited", "allowed_hosts": [gateway]}},
        )
        vault = vault_create(display_name=f"bench-egress {run_id}")
        credential = credential_create(
            vault.id,
            auth={
                "type": "environment_variable",
                "secret_name": TOKEN_NAME,
                "secret_value": secret,
                "networking": {"type": "limited", "allowed_hosts": [gateway]},
                "injection_location": {"header": True, "body": False},
            },
            actor="bench",
        )
        plain = sandbox_provision(session_create(agent=agent, environment_id=environment).id)
        vaulted = sandbox_provision(
            session_create(agent=agent, environment_id=environment, vault_ids=[vault.id]).id
        )
        placeholder = provider.execute(
            vaulted.handle, "bash", {"command": f"printf %s ${TOKEN_NAME}"}
        ).strip()
        if placeholder != f"wbph_{credential.id}":
            raise Failed(f"bench/egress: the vaulted sandbox's {TOKEN_NAME} is not its placeholder")
        # The same image, limits, CA mount (the run's CA where a sandbox has the proxy's bundle) and DNS as a
        # sandbox on the egress network, by the same provider; on the direct network, and no proxy.
        direct = provider.provision(
            Resources(
                image=settings.SANDBOX_IMAGE,
                disk_mb=settings.SANDBOX_DISK_MB if settings.SANDBOX_DISK_QUOTA else None,
                egress=EgressRoute(
                    network=direct_network,
                    subnet=direct_subnet,
                    bridge=direct_bridge,
                    proxy_port=0,
                    ca_bundle=str(ca.ca_file),
                    firewall=False,
                ),
                labels={"workbench.deployment": DEPLOYMENT, "workbench.sandbox": f"bench-direct-{run_id}"},
                env={TOKEN_NAME: placeholder, "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"},
            )
        )
        for handle in (plain.handle, vaulted.handle, direct):
            provider.execute(handle, "bash", {"command": f"cat > /tmp/client.py <<'EOF'\n{CLIENT}\nEOF"})

        mcp_vault = vault_create(display_name=f"bench-egress mcp {run_id}")
        guarded = f"http://{MCP_HOST}:{ports['mcp_guarded']}/mcp"
        mcp_credential = credential_create(
            mcp_vault.id,
            auth={"type": "static_bearer", "mcp_server_url": guarded, "token": mcp_token},
            actor="bench",
        )
        mcp_session = session_create(agent=agent, environment_id=environment, vault_ids=[mcp_vault.id]).id
        yield Rig(
            provider=provider,
            echo=echo,
            plain=plain.handle,
            vaulted=vaulted.handle,
            direct=direct,
            secret=secret,
            placeholder=placeholder,
            mcp_session=mcp_session,
            mcp_credential=mcp_credential.id,
            mcp_guarded=guarded,
            mcp_open=f"http://{MCP_HOST}:{ports['mcp_open']}/mcp",
            door={
                "EGRESS_HARNESS_URL": f"http://127.0.0.1:{ports['door']}",
                "EGRESS_HARNESS_TOKEN": harness_token,
                "EGRESS_CA_FILE": str(names["EGRESS_DATA_DIR"] / "sandbox-ca-bundle.crt"),
            },
        )


# -- the MCP server (a process of its own: `python -m bench.egress --serve-mcp HOST:GUARDED:OPEN`)


def bearer_guard(app: Any, token: str) -> Any:
    """`app` behind a bearer token: a 401 without it, as MCP servers answer."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"www-authenticate", b'Bearer realm="mcp"'), (b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return guarded


def serve_mcp(spec: str, token: str) -> None:
    """Two listeners of the same MCP server code: one requires `token`, one checks none."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from mcp.server.transport_security import TransportSecuritySettings

    host, guarded_port, open_port = spec.split(":")

    def app() -> Any:
        server = MCPServer("bench-egress")

        @server.tool()
        def echo(text: str) -> str:
            """Say the text back."""
            return f"echo: {text}"

        # The SDK guards a local server against DNS rebinding by its Host header: let this host in.
        security = TransportSecuritySettings(
            allowed_hosts=[f"{host}:*"], allowed_origins=[f"http://{host}:*"]
        )
        return server.streamable_http_app(host=host, transport_security=security)

    servers = [
        uvicorn.Server(
            uvicorn.Config(bearer_guard(app(), token), host=host, port=int(guarded_port), log_level="warning")
        ),
        uvicorn.Server(uvicorn.Config(app(), host=host, port=int(open_port), log_level="warning")),
    ]
    for server in servers:
        threading.Thread(target=server.run, daemon=True).start()
    while not all(server.started for server in servers):
        time.sleep(0.02)
    print("ready", flush=True)
    threading.Event().wait()


# -- the measurements


def run_batch(rig: Rig, handle: str, case: Case, side: str, count: int) -> dict[str, Any]:
    url = f"{rig.echo.url}/{case.key}/{side}"
    command = ["python3", "/tmp/client.py", case.mode, url, str(count), *case.headers]
    out = rig.provider.execute(handle, "bash", {"command": shlex.join(command)}, timeout_s=300)
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise Failed(f"bench/egress: the {side} client of {case.key!r} failed:\n{redacted(rig, out[-2000:])}")
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    if result["statuses"] != [200]:
        raise Failed(
            f"bench/egress: the {side} client of {case.key!r} got {result['statuses']}: "
            + redacted(rig, result["body"][:500])
        )
    return result


def redacted(rig: Rig, text: str) -> str:
    """What a sandbox printed, for an error message: without the secret, had the proxy let it through."""
    return text.replace(rig.secret, "[the credential's secret]")


def https_rows(rig: Rig, plan: Plan, progress: Callable[[str], None] = say) -> list[dict[str, Any]]:
    """The sandbox's HTTPS cases, the proxied batch and the direct one taking turns, round after round."""
    header = (f"Authorization: Bearer ${TOKEN_NAME}",)
    cases = [
        Case("keepalive", "sandbox HTTPS GET, keep-alive", "keepalive", rig.plain),
        Case("new", "sandbox HTTPS GET, a new connection each", "new", rig.plain),
        Case(
            "substituted",
            "sandbox HTTPS GET, keep-alive, placeholder substituted",
            "keepalive",
            rig.vaulted,
            header,
        ),
    ]
    samples: dict[str, dict[str, list[float]]] = {c.key: {"proxied": [], "direct": []} for c in cases}
    paired: dict[str, list[float]] = {c.key: [] for c in cases}
    last: dict[str, dict[str, Any]] = {}
    for n in range(plan.warmup + plan.rounds):
        for case in cases:
            proxied = run_batch(rig, case.proxied, case, "proxied", plan.batch)
            direct = run_batch(rig, rig.direct, case, "direct", plan.batch)
            last[case.key] = {"proxied": proxied, "direct": direct}
            if n < plan.warmup:
                continue
            samples[case.key]["proxied"] += proxied["ms"]
            samples[case.key]["direct"] += direct["ms"]
            paired[case.key].append(statistics.median(proxied["ms"]) - statistics.median(direct["ms"]))
        if n >= plan.warmup:
            progress(
                f"round {n - plan.warmup + 1}/{plan.rounds}: "
                + ", ".join(f"{c.key} {paired[c.key][-1]:+.2f} ms" for c in cases)
                + " added"
            )
    check_substitution(rig, last["substituted"])
    return [
        row(case.measurement, samples[case.key]["direct"], samples[case.key]["proxied"], paired[case.key])
        for case in cases
    ]


def check_substitution(rig: Rig, last: dict[str, dict[str, Any]]) -> None:
    """The proxied requests reached the server with the secret and their answers came back without it; the
    direct ones carried the placeholder as it is. (Says nothing of the secret itself if not.)"""
    seen = [
        headers.get("Authorization") for path, headers, _ in rig.echo.seen if path == "/substituted/proxied"
    ]
    if not seen or any(value != f"Bearer {rig.secret}" for value in seen):
        raise Failed("bench/egress: the proxy did not substitute the placeholder in every proxied request")
    if rig.secret in last["proxied"]["body"] or rig.placeholder not in last["proxied"]["body"]:
        raise Failed("bench/egress: the echoed answer reached the sandbox without the secret scrubbed")
    direct = [
        headers.get("Authorization") for path, headers, _ in rig.echo.seen if path == "/substituted/direct"
    ]
    if any(value != f"Bearer {rig.placeholder}" for value in direct):
        raise Failed("bench/egress: the direct requests did not carry the placeholder unchanged")


def mcp_row(rig: Rig, plan: Plan, progress: Callable[[str], None] = say) -> dict[str, Any]:
    """`call_tool` through the door and directly, alternating call by call."""
    from django.test import override_settings

    from harness.mcp import call_tool
    from harness.tools import McpTarget

    sides = {
        "proxied": (McpTarget("tools", rig.mcp_guarded, "echo"), rig.door),
        "direct": (McpTarget("tools", rig.mcp_open, "echo"), {"EGRESS_HARNESS_URL": ""}),
    }

    def call(side: str, n: int) -> float:
        target, overrides = sides[side]
        text = f"call {n}"
        with override_settings(**overrides):
            started = time.perf_counter()
            content, failed = call_tool(rig.mcp_session, target, {"text": text}, cancelled=lambda: False)
            took = (time.perf_counter() - started) * 1000
        if failed or content != [{"type": "text", "text": f"echo: {text}"}]:
            raise Failed(f"bench/egress: the {side} MCP call answered {content!r}")
        return took

    samples: dict[str, list[float]] = {"proxied": [], "direct": []}
    paired: list[float] = []
    every = max(1, plan.mcp_calls // 5)
    for n in range(plan.mcp_warmup + plan.mcp_calls):
        proxied, direct = call("proxied", n), call("direct", n)
        if n < plan.mcp_warmup:
            continue
        samples["proxied"].append(proxied)
        samples["direct"].append(direct)
        paired.append(proxied - direct)
        if (n - plan.mcp_warmup + 1) % every == 0:
            progress(
                f"MCP calls {n - plan.mcp_warmup + 1}/{plan.mcp_calls}: "
                f"{statistics.median(paired):+.2f} ms added so far (paired)"
            )
    measured = row("MCP call (harness.mcp.call_tool)", samples["direct"], samples["proxied"], paired)
    measured["requests_per_call"] = requests_per_call(rig, plan.mcp_warmup + plan.mcp_calls)
    return measured


def requests_per_call(rig: Rig, calls: int) -> dict[str, float]:
    """The HTTP requests one call made through the door, by method: the proxy audits each injection (on a
    thread of its own, so the count is read once it stops growing)."""
    from vault.models import CredentialUse

    uses = CredentialUse.objects.filter(credential_id=rig.mcp_credential, action="inject")
    counted, count = -1, uses.count()
    while count != counted:
        time.sleep(0.5)
        counted, count = count, uses.count()
    methods: dict[str, int] = {}
    for detail in uses.values_list("detail", flat=True):
        method = detail.split(" MCP ", 1)[-1].split(" ", 1)[0]
        methods[method] = methods.get(method, 0) + 1
    return {method: round(n / calls, 2) for method, n in sorted(methods.items())}


def row(measurement: str, direct: list[float], proxied: list[float], paired: list[float]) -> dict[str, Any]:
    def side(values: list[float]) -> dict[str, Any]:
        return {
            "p50_ms": round(percentile(values, 0.5), 3),
            "p95_ms": round(percentile(values, 0.95), 3),
            "samples_ms": [round(v, 3) for v in values],
        }

    d, p = side(direct), side(proxied)
    added = round(p["p50_ms"] - d["p50_ms"], 3)
    return {
        "measurement": measurement,
        "n": len(direct),
        "direct": d,
        "proxied": p,
        "added_p50_ms": added,
        "added_p95_ms": round(p["p95_ms"] - d["p95_ms"], 3),
        "ratio_p50": round(p["p50_ms"] / d["p50_ms"], 3) if d["p50_ms"] else None,
        "paired_added_p50_ms": round(statistics.median(paired), 3),
        "target": f"added p50 <= {TARGET_ADDED_P50_MS:g} ms",
        "met": added <= TARGET_ADDED_P50_MS,
    }


def measure(rig: Rig, plan: Plan, progress: Callable[[str], None] = say) -> list[dict[str, Any]]:
    """Every row of the table: the three HTTPS cases, then the MCP call."""
    return [*https_rows(rig, plan, progress), mcp_row(rig, plan, progress)]


METHOD = [
    "A sandbox's HTTPS GET to a local echoing HTTPS server (tests/vault/egress/servers.py, a CA made for the "
    "run), timed inside the container by the same Python client (http.client) on both sides. *Through the "
    "proxy*: a sandbox the platform provisions with SANDBOX_EGRESS on (the egress network, HTTPS_PROXY with "
    "its identity, the proxy's CA bundle), its environment `limited` to the server's host. *Directly*: a "
    "second container of the same image, provisioned by the same provider with the same limits, CA mount and "
    "DNS, on an internal network of its own whose gateway address the server listens on, with no proxy. A "
    "container rather than the host, so that both sides pay the same veth, bridge and container CPU limit, "
    "and the difference is the proxy's alone; both sides hit the same server. Keep-alive: one connection (a "
    "CONNECT tunnel through the proxy), its first request not timed; a new connection each: TCP, the CONNECT "
    "and two TLS handshakes through the proxy, TCP and one handshake directly; the substitution case sends "
    "`Authorization: Bearer $BENCH_TOKEN`, an `environment_variable` placeholder the proxy replaces with the "
    "secret (audited) and scrubs from the echoed answer (checked). The batches alternate, proxied then "
    "direct, round after round.",
    "An MCP call: `harness.mcp.call_tool`, the whole call (a new MCP session over streamable HTTP: initialize"
    " and its notification, the SDK's GET stream, the tool call, the `tools/list` the SDK adds to check the "
    "result against the tool's output schema, the session's DELETE) of a local MCP server's `echo` tool (the "
    "`mcp` SDK under uvicorn, a process of its own, plain http on 127.0.0.3 as EGRESS_PLAIN_HOSTS allows for "
    "local servers). *Through the proxy*: EGRESS_HARNESS_URL set, the workers' door adds the bearer token "
    "from a `static_bearer` credential in the session's vault, to the server's listener that requires it. "
    "*Directly*: EGRESS_HARNESS_URL empty, to a second listener of the same server code in the same process "
    "that checks no token. The calls alternate, proxied then direct. An https MCP server would add the "
    "proxy's second TLS handshake per call (see the new-connection row), which this does not include.",
    "*Added* is the difference of the two sides' p50s (and p95s); *paired* the median over rounds of the "
    "difference of the batches' medians (HTTPS) or over calls of each proxied call minus the direct call "
    "after it (MCP), which the machine's drift moves less. The proxy runs as in production: its policy cache "
    "5 s, each substitution audited.",
]


# -- the results


def result_of(
    rows: list[dict[str, Any]], plan: Plan, *, machine: dict[str, Any], quick: bool, seconds: float
) -> dict[str, Any]:
    met = sum(1 for r in rows if r["met"])
    return {
        "benchmark": "egress",
        "quick": quick,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
        "seconds": round(seconds, 1),
        "plan": asdict(plan),
        "method": METHOD,
        "rows": rows,
        "targets": {"met": met, "total": len(rows)},
    }


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    plt = pyplot()
    rows = result["rows"]
    figure, axes = plt.subplots(1, len(rows), figsize=(3.4 * len(rows), 4.6))
    for axis, r in zip(axes, rows, strict=True):
        axis.boxplot([r["direct"]["samples_ms"], r["proxied"]["samples_ms"]], showfliers=False)
        axis.set_xticks([1, 2], ["direct", "through\nthe proxy"], fontsize=8)
        axis.set_ylabel("ms")
        axis.set_title(r["measurement"].replace(", ", ",\n", 1), fontsize=8)
        for x, side in ((1, "direct"), (2, "proxied")):
            axis.annotate(
                f"p50 {r[side]['p50_ms']:.2f}",
                (x, r[side]["p50_ms"]),
                fontsize=7,
                xytext=(18, 0),
                textcoords="offset points",
                va="center",
            )
        axis.set_xlabel(
            f"added p50 {r['added_p50_ms']:+.2f} ms: {'met' if r['met'] else 'missed'}",
            color="tab:green" if r["met"] else "tab:red",
            fontsize=8,
        )
    save_figure(figure, path, title)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few samples, for a smoke run")
    parser.add_argument(
        "--rounds", type=int, help=f"HTTPS batches per side and case (default {DEFAULT.rounds})"
    )
    parser.add_argument("--batch", type=int, help=f"HTTPS requests per batch (default {DEFAULT.batch})")
    parser.add_argument("--mcp-calls", type=int, help=f"MCP calls per side (default {DEFAULT.mcp_calls})")
    parser.add_argument("--serve-mcp", help=argparse.SUPPRESS)  # the MCP server's own process
    service_arguments(parser)
    args = parser.parse_args()
    if args.serve_mcp:
        serve_mcp(args.serve_mcp, os.environ["BENCH_MCP_TOKEN"])
        return 0
    base = QUICK if args.quick else DEFAULT
    plan = Plan(
        rounds=args.rounds or base.rounds,
        batch=args.batch or base.batch,
        mcp_calls=args.mcp_calls or base.mcp_calls,
        warmup=base.warmup,
        mcp_warmup=base.mcp_warmup,
    )
    began = time.monotonic()
    subprocess.run([ROOT / "scripts" / "start-dockerd.sh"], check=False)
    subprocess.run([ROOT / "scripts" / "build-image.sh"], check=False)
    os.environ["WORKBENCH_DEPLOYMENT"] = DEPLOYMENT
    with Launcher("egress", database_url=args.database_url, redis_url=args.redis_url) as system:
        system.start_services()
        machine = machine_info(tools=True)
        warn_if_busy(machine)
        with rig(system.folder / "rig", database_url=system.database_url or "") as ready:
            rows = measure(ready, plan)
        machine["load_average_at_end"] = load_average()
    result = result_of(rows, plan, machine=machine, quick=args.quick, seconds=time.monotonic() - began)
    title = f"bench/egress on {machine['nproc']} CPUs, Docker {machine.get('docker') or '-'}, {result['at']}"
    publish(stem("egress", args.quick), result, lambda png: plot(result, png, title))
    return 0


if __name__ == "__main__":
    run(main)
