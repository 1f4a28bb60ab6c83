"""vault/egress/policy.py: which hosts a sandbox may reach, which credential applies where, what comes back."""

from __future__ import annotations

import base64

from vault.egress.policy import (
    REDACTED,
    EnvCredential,
    Repository,
    SandboxPolicy,
    StreamScrubber,
    address_refusal,
    host_refusal,
    placeholder,
    private_allowed,
    repository_for,
    scrub,
    substitute,
)

SECRET = "sk-live-canary-51f0"


def _credential(hosts: tuple[str, ...] | None = ("api.example.com",), **options: bool) -> EnvCredential:
    return EnvCredential("vcrd_1", "vlt_1", "API_KEY", SECRET, hosts, **options)


def test_unrestricted_networking_allows_any_host():
    assert host_refusal("anything.example", {"type": "unrestricted"}) is None


def test_limited_networking_allows_its_hosts_wildcards_and_the_sessions_repositories_only():
    networking = {"type": "limited", "allowed_hosts": ["api.example.com", "*.cdn.example"]}
    assert host_refusal("API.example.com.", networking) is None
    assert host_refusal("a.cdn.example", networking) is None
    assert host_refusal("cdn.example", networking) is not None  # a wildcard does not match the bare domain
    assert host_refusal("github.com", networking, ["github.com"]) is None
    why = host_refusal("evil.example", networking)
    assert why and "evil.example" in why and "api.example.com, *.cdn.example" in why


def test_package_manager_hosts_only_when_the_environment_allows_them():
    networking = {"type": "limited", "allowed_hosts": ["api.example.com"], "allow_package_managers": False}
    assert "package manager" in (host_refusal("pypi.org", networking) or "")
    assert host_refusal("pypi.org", {**networking, "allow_package_managers": True}) is None
    assert host_refusal("files.pythonhosted.org", {**networking, "allow_package_managers": True}) is None


def test_private_and_special_addresses_are_refused_unless_listed_with_their_port():
    for address in (
        "127.0.0.1",
        "10.1.2.3",
        "172.17.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "100.64.0.1",
    ):
        assert address_refusal(address, 80, []) is not None, address
    assert address_refusal("93.184.215.14", 443, []) is None
    allowed = private_allowed(["127.0.0.1:8443", "10.9.0.0/16"])
    assert address_refusal("127.0.0.1", 8443, allowed) is None
    assert address_refusal("127.0.0.1", 5432, allowed) is not None
    assert address_refusal("10.9.3.4", 22, allowed) is None
    assert "link-local" in (address_refusal("169.254.169.254", 80, []) or "")


def test_a_placeholder_becomes_the_secret_only_on_the_credentials_hosts_and_where_it_may_go():
    credential = _credential()
    mark = placeholder("vcrd_1").encode()
    done = substitute(b"Bearer " + mark, [credential], "api.example.com", where="header")
    assert done.value == f"Bearer {SECRET}".encode() and done.injected == {"vcrd_1"}
    elsewhere = substitute(b"Bearer " + mark, [credential], "evil.example", where="header")
    assert elsewhere.value == b"Bearer " + mark and elsewhere.refused == {"vcrd_1"}
    in_body = substitute(b"key=" + mark, [credential], "api.example.com", where="body")
    assert in_body.value == b"key=" + mark and in_body.refused == {"vcrd_1"}  # body injection is off
    body_on = _credential(body=True)
    assert (
        substitute(b"key=" + mark, [body_on], "api.example.com", where="body").value
        == f"key={SECRET}".encode()
    )
    anywhere = _credential(hosts=None)
    assert substitute(mark, [anywhere], "x.example", where="header").injected == {"vcrd_1"}
    assert substitute(b"nothing here", [credential], "api.example.com", where="header").injected == set()


def test_every_secret_of_the_session_is_scrubbed_from_what_comes_back():
    repository = Repository("res_1", "https://git.example/org/repo.git", "ghp_tok")
    policy = SandboxPolicy("sbx_1", "h", "sesn_1", {"type": "unrestricted"}, (_credential(),), (repository,))
    basic = base64.b64encode(b"x-access-token:ghp_tok")
    data = f"{SECRET} and ghp_tok and ".encode() + basic
    clean = scrub(data, policy.secrets())
    assert SECRET.encode() not in clean and b"ghp_tok" not in clean and basic not in clean
    assert placeholder("vcrd_1").encode() in clean and REDACTED.encode() in clean


def test_a_streamed_body_is_scrubbed_even_when_a_secret_straddles_two_chunks():
    secrets = [(SECRET.encode(), b"wbph_vcrd_1")]
    scrubber = StreamScrubber(secrets)
    body = f"start {SECRET} middle {SECRET} end".encode()
    out = b"".join(scrubber(body[i : i + 5]) for i in range(0, len(body), 5)) + scrubber(b"")
    assert out == b"start wbph_vcrd_1 middle wbph_vcrd_1 end"


def test_a_repository_token_goes_only_to_requests_under_that_repository():
    repository = Repository("res_1", "https://git.example/org/repo.git", "t")
    for url in (
        "https://git.example/org/repo.git/info/refs?service=git-upload-pack",
        "https://git.example/org/repo/git-receive-pack",
        "https://git.example:443/org/repo.git/git-upload-pack",
    ):
        assert repository_for(url, [repository]) is repository, url
    for url in (
        "https://git.example/org/repository/info/refs",
        "https://git.example/org/other.git/info/refs",
        "https://evil.example/org/repo.git/info/refs",
        "http://git.example/org/repo.git/info/refs",
        "https://git.example:8443/org/repo.git/info/refs",
    ):
        assert repository_for(url, [repository]) is None, url


def test_plain_http_repositories_only_on_the_plain_hosts():
    repository = Repository("res_1", "http://127.0.0.1:9000/repo.git", "t")
    url = "http://127.0.0.1:9000/repo.git/info/refs"
    assert repository_for(url, [repository]) is None
    assert repository_for(url, [repository], plain_hosts=["127.0.0.1"]) is repository


def test_placeholders_are_deterministic_and_hold_nothing_of_the_secret():
    assert placeholder("vcrd_abc") == placeholder("vcrd_abc") == "wbph_vcrd_abc"
