"""Environment names are unique, as on the hosted service: a create or a rename to a taken name is a 409
in the error envelope, typed `invalid_request_error` (reference §5.1, §13)."""

from __future__ import annotations

import threading

import anthropic
import pytest

from kernel.errors import Conflict
from sandboxes.environments import environment_create
from sandboxes.models import Environment
from tests.api.test_api import assert_error
from tests.conftest import in_thread, on_postgres, require


@pytest.mark.django_db
def test_creating_a_second_environment_under_a_taken_name_is_a_409_and_creates_nothing(api):
    first = api.post("/v1/environments", {"name": "box"}).json()
    body = assert_error(
        api.post("/v1/environments", {"name": "box", "description": "again"}),
        409,
        "invalid_request_error",
        mentions="'box'",
    )
    assert first["id"] in body["error"]["message"]
    assert [e["id"] for e in api.get("/v1/environments").json()["data"]] == [first["id"]]


@pytest.mark.django_db
def test_renaming_to_a_taken_name_is_a_409_and_changes_nothing(api):
    taken = api.post("/v1/environments", {"name": "taken"}).json()
    other = api.post("/v1/environments", {"name": "other"}).json()
    assert_error(
        api.post(f"/v1/environments/{other['id']}", {"name": "taken", "description": "new"}),
        409,
        "invalid_request_error",
        mentions=taken["id"],
    )
    kept = api.get(f"/v1/environments/{other['id']}").json()
    assert kept["name"] == "other" and kept["description"] is None
    same = api.post(f"/v1/environments/{other['id']}", {"name": "other", "description": "kept its name"})
    assert same.status_code == 200, same.content


@pytest.mark.django_db
def test_an_archived_environment_keeps_its_name_and_a_deleted_one_frees_it(api):
    old = api.post("/v1/environments", {"name": "reused"}).json()
    api.post(f"/v1/environments/{old['id']}/archive")
    assert_error(
        api.post("/v1/environments", {"name": "reused"}), 409, "invalid_request_error", mentions="archived"
    )
    api.delete(f"/v1/environments/{old['id']}")
    new = api.post("/v1/environments", {"name": "reused"})
    assert new.status_code == 200, new.content
    assert new.json()["id"] != old["id"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_creates_racing_for_one_name_let_exactly_one_in():
    require(on_postgres(), "racing transactions need PostgreSQL; run with DATABASE_URL=postgres://…")
    start = threading.Barrier(6)
    outcomes: list[str] = []

    def create() -> None:
        start.wait()
        try:
            environment_create(**{"name": "contested"})
            outcomes.append("created")
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=in_thread, args=(create,)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["conflict"] * 5 + ["created"]
    assert Environment.objects.filter(name="contested").count() == 1


@pytest.mark.server
def test_the_official_sdk_raises_its_conflict_error_for_a_taken_name(live_server_url, api_key):
    sdk = anthropic.Anthropic(base_url=live_server_url, api_key=api_key, max_retries=0, timeout=30)
    first = sdk.beta.environments.create(name="sdk box", config={"type": "cloud"})
    with pytest.raises(anthropic.ConflictError) as clash:
        sdk.beta.environments.create(name="sdk box", config={"type": "cloud"})
    assert clash.value.body["error"]["type"] == "invalid_request_error" and first.id in clash.value.message
    second = sdk.beta.environments.create(name="sdk box 2", config={"type": "cloud"})
    with pytest.raises(anthropic.ConflictError):
        sdk.beta.environments.update(second.id, name="sdk box")


@pytest.mark.django_db(transaction=True)
def test_the_migration_renames_duplicate_live_names_and_keeps_the_oldest():
    """A database that took duplicates before the index can still be migrated; every row keeps its id."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("sandboxes", "0002_sandbox")], [("sandboxes", "0003_environment_live_name_unique")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps.get_model("sandboxes", "Environment")
        first, second, third = (old.objects.create(name="dup", config={}) for _ in range(3))
        gone = old.objects.create(name="dup", config={}, deleted_at="2026-01-01T00:00:00Z")
        MigrationExecutor(connection).migrate(after)
    finally:
        # Every app back to its latest migration (going back to 0002 also unapplied the later ones).
        latest = MigrationExecutor(connection)
        latest.migrate(latest.loader.graph.leaf_nodes())
    names = dict(Environment.objects.values_list("id", "name"))
    assert names[first.id] == "dup" and names[gone.id] == "dup"
    assert names[second.id] == f"dup ({second.id})" and names[third.id] == f"dup ({third.id})"
