"""vault/egress/resolver.py and control.py, on loopback only."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from vault.egress.control import Control
from vault.egress.policy import private_allowed
from vault.egress.resolver import Refused, Resolver


async def test_the_resolver_answers_only_with_the_address_it_checked_and_refuses_private_ones():
    loop = asyncio.get_running_loop()
    resolver = Resolver(loop, private_allowed(["127.0.0.1:8443"]))
    info = await resolver.pin("127.0.0.1", 8443)
    assert info[4][:2] == ("127.0.0.1", 8443)
    assert await resolver.getaddrinfo("127.0.0.1", 8443, type=socket.SOCK_STREAM) == [info]
    with pytest.raises(Refused, match="loopback"):
        await resolver.getaddrinfo("127.0.0.1", 5432)
    why = await resolver.refusal("localhost", 5432)
    assert why and "resolves to" in why and "localhost" in why
    # Listening sockets resolve as the system does.
    assert await resolver.getaddrinfo("127.0.0.1", 0, flags=socket.AI_PASSIVE)


async def test_the_resolver_keeps_its_answer_so_a_second_resolution_cannot_change_it():
    loop = asyncio.get_running_loop()
    answers = iter(
        [
            [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 443))],
            [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 443))],
        ]
    )

    async def system(host, port, **_):
        return next(answers)

    resolver = Resolver(loop, [])
    resolver._system = system  # a name server that answers a public address, then a private one
    assert await resolver.refusal("rebind.example", 443) is None
    assert (await resolver.getaddrinfo("rebind.example", 443))[0][4][0] == "93.184.215.14"


def test_the_control_endpoint_answers_healthz_and_checks_validate_requests():
    control = Control("http://127.0.0.1:1", token="t", health=lambda: {"listening": "x"})
    status, _, body = control.answer("GET /healthz HTTP/1.1\r\nHost: x").partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200") and json.loads(body)["status"] == "ok"
    assert control.answer("POST /validate HTTP/1.1\r\n").startswith(b"HTTP/1.1 401")
    # Without a workers' door there is nothing to validate with.
    assert control.answer("POST /validate HTTP/1.1\r\nAuthorization: Bearer t").startswith(b"HTTP/1.1 501")
    assert control.answer("GET /other HTTP/1.1\r\n").startswith(b"HTTP/1.1 404")

    async def validate(request):
        return 200, request

    control = Control("http://127.0.0.1:1", token="t", health=dict, validate=validate)
    head = "POST /validate HTTP/1.1\r\nAuthorization: Bearer t\r\nContent-Length: "
    assert control.answer(head + "9").length == 9
    assert control.answer(head + "many").startswith(b"HTTP/1.1 400")
    assert control.answer(head + str(10**6)).startswith(b"HTTP/1.1 400")
    assert control.answer("GET /validate HTTP/1.1\r\nAuthorization: Bearer t").startswith(b"HTTP/1.1 405")
    answer = asyncio.run(control._validate(b"[1]"))
    assert answer.startswith(b"HTTP/1.1 400") and b"JSON object" in answer
