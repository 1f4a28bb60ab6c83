"""Workspaces and roles in the UI: every page and action, enumerated from the UI's URL list, for a viewer, an
operator and an admin of one workspace and a member of another (Django's test client; the browser tests
drive the pages themselves). Another workspace's objects answer 404, as missing ones; a role below the one a
page or action needs gets 403 and changes nothing; the lowest role that may, may. A route without a rule here
fails the test, so a new page cannot arrive without one."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import URLPattern

from kernel.models import ApiKey, AuditEntry, Membership, Workspace
from kernel.tenancy import may
from sessions.models import Event
from tests.api.test_tenancy import _state, two  # noqa: F401 - `two` is a fixture
from tests.conftest import operator_of
from workbench.ui.urls import urlpatterns

pytestmark = pytest.mark.django_db(transaction=True)  # the timeline fragment reads on another thread

V, O, A = "viewer", "operator", "admin"  # noqa: E741 - the roles, as the rules table reads them
# Each page or action: the role that may read it (GET; None: POST only) and the role that may change
# anything through it (POST; None: a page that only reads).
RULES: dict[str, tuple[str | None, str | None]] = {
    "sessions": (V, None),
    "session-start": (None, O),
    "session": (V, None),
    "session-events": (V, None),
    "session-send": (None, O),
    "session-panel": (V, None),
    "session-harness": (None, O),
    "session-archive": (None, O),
    "session-replay": (V, None),
    "session-fork": (V, O),
    "hand-provision": (None, O),
    "hand-attach": (None, O),
    "hand-detach": (None, O),
    "hand-transfer": (None, O),
    "hand-terminate": (None, O),
    "sandboxes": (V, None),
    "sandbox-terminate": (None, O),
    "agents": (V, None),
    "agent-new": (O, O),
    "agent": (V, O),
    "agent-archive": (None, O),
    "environments": (V, None),
    "environment-new": (O, O),
    "environment": (V, O),
    "environment-archive": (None, O),
    "environment-key-create": (None, A),
    "environment-key-revoke": (None, A),
    "vaults": (V, A),
    "vault": (V, None),
    "vault-archive": (None, A),
    "credential-add": (None, A),
    "credential-replace": (None, A),
    "credential-archive": (None, A),
    "keys": (A, None),
    "key-create": (None, A),
    "key-revoke": (None, A),
}
# Pages of no workspace: logging in and out, static files, choosing the workspace (tested below).
OUTSIDE = {"login", "logout", "static", "workspace-switch"}


def _routes() -> list[tuple[str, str]]:
    routes = []
    for pattern in urlpatterns:
        assert isinstance(pattern, URLPattern)
        routes.append((str(pattern.name), str(pattern.pattern)))
    return routes


def _fill(name: str, route: str, objects: dict[str, Any]) -> str:
    def value(match: re.Match[str]) -> str:
        param = match[1]
        if param == "environment_id" and name.startswith("environment-key"):
            param = "hosted_id"
        if param == "key_id" and name.startswith("key-"):
            param = "api_key_pk"
        assert param in objects, f"{route} names <{param}>, which this test has no rule for: add one"
        return str(objects[param])

    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", value, route)


def _everything() -> tuple[Any, ...]:
    return (*_state(), ApiKey.objects.filter(revoked_at__isnull=False).count(), Membership.objects.count())


@pytest.fixture
def spaces(two: dict[str, Any]) -> dict[str, Any]:  # noqa: F811 - the fixture imported above
    """Two workspaces' objects (test_tenancy's), each with an API key's number, and the people."""
    for space in two.values():
        space["objects"]["api_key_pk"] = ApiKey.objects.filter(workspace_id=space["id"]).first().pk
    people = {}
    for role, username in ((V, "vera"), (O, "otto"), (A, "ada")):
        people[role] = operator_of(User.objects.create_user(username, password="x", is_staff=True), role)
    people["stranger"] = operator_of(
        User.objects.create_user("stranger", password="x", is_staff=True), A, two["b"]["id"]
    )
    return {**two, "people": people}


def test_every_ui_route_has_a_rule():
    names = {name for name, _ in _routes()}
    assert names - OUTSIDE == set(RULES), "a UI route without a rule here, or a rule for no route"


@pytest.mark.parametrize("name,route", [r for r in _routes() if r[0] in RULES and "<" in r[1]])
def test_another_workspaces_object_answers_as_a_missing_one(client, spaces, name, route):
    """The admin of the other workspace, on this one's objects: 404 for reading and for acting."""
    client.force_login(spaces["people"]["stranger"])
    path = _fill(name, route, spaces["a"]["objects"])
    before = _everything()
    for method in ("get", "post"):
        answer = getattr(client, method)(path)
        assert answer.status_code in (404, 405), (method, path, answer.status_code)
    assert _everything() == before
    # The same paths with its own workspace's objects are not refused.
    own = _fill(name, route, spaces["b"]["objects"])
    read, _ = RULES[name]
    if read is not None:
        assert client.get(own).status_code == 200, own


@pytest.mark.parametrize("name,route", [r for r in _routes() if r[0] in RULES])
def test_each_role_may_what_its_rule_says_and_no_more(client, spaces, name, route):
    read, write = RULES[name]
    path = _fill(name, route, spaces["a"]["objects"])
    people = spaces["people"]
    for role in (V, O, A):
        client.force_login(people[role])
        if read is not None:
            answer = client.get(path)
            expected = 200 if may(role, read) else 403
            assert answer.status_code == expected, (role, "GET", path, answer.status_code)
        if write is not None and not may(role, write):
            before = _everything()
            answer = client.post(path, HTTP_HX_REQUEST="true")
            assert answer.status_code == 403, (role, "POST", path, answer.status_code)
            assert f"this needs {write} or above" in answer.content.decode()
            assert _everything() == before, f"a refused {role} changed something through {path}"
    if write is not None:
        lowest = next(role for role in (V, O, A) if may(role, write))
        client.force_login(people[lowest])
        answer = client.post(path, HTTP_HX_REQUEST="true")
        assert answer.status_code not in (403, 404), (lowest, "POST", path, answer.status_code)


def test_a_viewer_watches_a_session_without_a_composer(client, spaces):
    client.force_login(spaces["people"][V])
    page = client.get(f"/sessions/{spaces['a']['objects']['session_id']}/").content.decode()
    assert "You watch this session as a viewer of default" in page
    assert 'name="text"' not in page
    assert 'class="panel watch-only"' in page  # the hands panel offers no actions


def test_a_member_of_no_workspace_is_told_so_and_a_superuser_sees_every_workspace(client, spaces):
    nobody = User.objects.create_user("nobody", password="x", is_staff=True)
    client.force_login(nobody)
    answer = client.get("/")
    assert answer.status_code == 403 and "a member of no workspace" in answer.content.decode()
    assert client.get(f"/sessions/{spaces['a']['objects']['session_id']}/").status_code == 404

    root = User.objects.create_superuser("root", password="x")
    client.force_login(root)
    for space in ("a", "b"):
        assert client.get(f"/sessions/{spaces[space]['objects']['session_id']}/").status_code == 200


def test_the_switcher_changes_the_workspace_lists_show_and_new_keys_go_to(client, spaces):
    admin = spaces["people"][A]
    operator_of(admin, A, spaces["b"]["id"])
    client.force_login(admin)
    session_a, session_b = spaces["a"]["objects"]["session_id"], spaces["b"]["objects"]["session_id"]
    listing = client.get("/").content.decode()
    assert session_a in listing and session_b not in listing
    assert 'name="workspace"' in listing  # a member of two gets the switcher

    refused = client.post("/workspace", {"workspace": "nowhere"}, follow=True)
    assert "You are not a member of a workspace &#x27;nowhere&#x27;" in refused.content.decode()
    client.post("/workspace", {"workspace": "other"})
    listing = client.get("/").content.decode()
    assert session_b in listing and session_a not in listing

    client.post("/keys/new", {"name": "made-in-other", "read_only": "on"})
    key = ApiKey.objects.get(name="made-in-other")
    assert key.workspace_id == spaces["b"]["id"] and key.read_only
    entry = AuditEntry.objects.get(action="api_key.created", target__startswith="made-in-other")
    assert entry.workspace_id == spaces["b"]["id"] and entry.actor == "user ada"


def test_what_a_person_sends_and_switches_records_who(client, spaces):
    client.force_login(spaces["people"][O])
    session = spaces["a"]["objects"]["session_id"]
    assert client.post(f"/sessions/{session}/harness", {"harness": "claude"}).status_code == 200
    switched = AuditEntry.objects.get(action="session.harness_switched", target=session)
    assert switched.actor == "user otto" and switched.detail == {"harness": "claude"}

    client.post(f"/sessions/{session}/send", {"kind": "message", "text": "hello"})
    sent = Event.objects.filter(session_id=session, type="user.message").latest("seq")
    assert sent.actor == "user otto"
    page = client.get(f"/sessions/{session}/").content.decode()
    assert "by user otto" in page


def test_the_admin_records_members_added_changed_and_removed(admin_client, spaces):
    workspace = Workspace.objects.get(id=spaces["b"]["id"])
    newcomer = User.objects.create_user("newcomer", password="x", is_staff=True)
    url = f"/admin/workbench/workspace/{workspace.id}/change/"
    existing = list(Membership.objects.filter(workspace=workspace).order_by("id"))
    form = {
        "slug": workspace.slug,
        "name": workspace.name,
        "memberships-TOTAL_FORMS": str(len(existing) + 1),
        "memberships-INITIAL_FORMS": str(len(existing)),
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
    }
    for i, m in enumerate(existing):
        form.update(
            {
                f"memberships-{i}-id": str(m.id),
                f"memberships-{i}-workspace": workspace.id,
                f"memberships-{i}-user": str(m.user_id),
                f"memberships-{i}-role": V,  # the stranger, an admin, becomes a viewer
            }
        )
    n = len(existing)
    form.update(
        {
            f"memberships-{n}-workspace": workspace.id,
            f"memberships-{n}-user": str(newcomer.id),
            f"memberships-{n}-role": O,
        }
    )
    answer = admin_client.post(url, form)
    assert answer.status_code == 302, answer.content.decode()[:2000]
    actions = {
        (e.action, e.target): e.detail
        for e in AuditEntry.objects.filter(workspace=workspace, action__startswith="member.")
    }
    assert actions[("member.added", "newcomer")] == {"role": O}
    assert actions[("member.role_changed", "stranger")] == {"role": V}
