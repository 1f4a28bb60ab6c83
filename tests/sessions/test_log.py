"""The session log: order, idempotency, leases, append-only, slices, broadcast."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection, transaction

from sessions.models import AppendOnlyError, Event, Session
from sessions.selectors import get_events
from sessions.services import SessionNotFound, StaleEpoch, emit_event
from sessions.services.log import SessionClosed
from tests.conftest import ROOT, child_env, in_thread, make_session, on_postgres, require


def message(text: str) -> dict:
    return {"type": "system.message", "content": [{"type": "text", "text": text}]}


@pytest.mark.django_db
def test_emit_event_assigns_consecutive_seqs_from_zero(session_id):
    events = [emit_event(session_id, message(str(i))) for i in range(5)]
    assert [e.seq for e in events] == [0, 1, 2, 3, 4]
    assert Session.objects.get(id=session_id).next_seq == 5


@pytest.mark.django_db
def test_emit_event_keeps_payload_and_stamps_processed_at(session_id):
    event = emit_event(session_id, message("hello"))
    api = event.as_api()
    assert api["type"] == "system.message"
    assert api["content"] == [{"type": "text", "text": "hello"}]
    assert api["id"].startswith("sevt_") and api["processed_at"]


@pytest.mark.django_db
def test_emit_event_with_the_same_idempotency_key_returns_the_first_event(session_id):
    first = emit_event(session_id, message("once"), idempotency_key="k1")
    again = emit_event(session_id, message("twice"), idempotency_key="k1")
    assert again.pk == first.pk and again.seq == 0
    assert Event.objects.filter(session_id=session_id).count() == 1
    assert Session.objects.get(id=session_id).next_seq == 1


@pytest.mark.django_db
def test_emit_event_rejects_a_stale_epoch_and_writes_nothing(session_id):
    Session.objects.filter(id=session_id).update(lease_epoch=3)
    emit_event(session_id, message("current"), epoch=3)
    with pytest.raises(StaleEpoch):
        emit_event(session_id, message("stale"), epoch=2)
    assert [e.payload["content"][0]["text"] for e in get_events(session_id)] == ["current"]
    assert Session.objects.get(id=session_id).next_seq == 1


@pytest.mark.django_db
def test_emit_event_into_an_unknown_session_raises_not_found():
    with pytest.raises(SessionNotFound):
        emit_event("sesn_missing", message("x"))


@pytest.mark.django_db
def test_the_orm_refuses_to_update_or_delete_events(session_id):
    event = emit_event(session_id, message("fixed"))
    event.type = "agent.message"
    with pytest.raises(AppendOnlyError):
        event.save()
    with pytest.raises(AppendOnlyError):
        event.delete()
    with pytest.raises(AppendOnlyError):
        Event.objects.filter(session_id=session_id).update(type="x")
    with pytest.raises(AppendOnlyError):
        Event.objects.filter(session_id=session_id).delete()
    assert Event.objects.get(pk=event.pk).type == "system.message"


@pytest.mark.postgres
@pytest.mark.django_db
def test_postgres_trigger_refuses_raw_updates_and_deletes(session_id):
    require(
        on_postgres(), "the append-only trigger exists on PostgreSQL only; run with DATABASE_URL=postgres://…"
    )
    from django.db import DatabaseError

    event = emit_event(session_id, message("fixed"))
    for sql in (
        "UPDATE agent_sessions_event SET type = 'x' WHERE id = %s",
        "DELETE FROM agent_sessions_event WHERE id = %s",
    ):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, [event.pk])
    assert Event.objects.get(pk=event.pk).type == "system.message"


SLICES = [
    (None, None),
    (0, 5),
    (3, 7),
    (-3, None),
    (None, -3),
    (-5, -2),
    (5, 3),
    (-100, 2),
    (8, 100),
    (10, None),
    (-1, None),
    (0, 0),
    (100, 200),
    (-10, None),
    (2, -2),
    (None, 100),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("start", "stop"), SLICES)
def test_get_events_slices_like_a_python_list(session_id, start, stop):
    for i in range(10):
        emit_event(session_id, message(str(i)))
    expected = list(range(10))[start:stop]
    assert [e.seq for e in get_events(session_id, start, stop)] == expected


@pytest.mark.django_db
def test_get_events_of_an_empty_session_is_empty(session_id):
    assert get_events(session_id, -20) == []


@pytest.mark.django_db
def test_get_events_filters_types_within_the_slice(session_id):
    for i in range(6):
        emit_event(session_id, message(str(i)) if i % 2 else {"type": "agent.message", "content": []})
    assert [e.seq for e in get_events(session_id, 1, 5, types=["agent.message"])] == [2, 4]


@pytest.mark.django_db
def test_get_events_reads_by_keyset_never_offset(session_id):
    from django.test.utils import CaptureQueriesContext

    for i in range(5):
        emit_event(session_id, message(str(i)))
    with CaptureQueriesContext(connection) as queries:
        get_events(session_id, -2)
        get_events(session_id, 1, -1)
    tail, middle = (q["sql"].upper() for q in (queries.captured_queries[0], queries.captured_queries[-1]))
    assert "OFFSET" not in tail + middle
    assert 'ORDER BY "AGENT_SESSIONS_EVENT"."SEQ" DESC' in tail and "LIMIT 2" in tail
    assert '"SEQ" >= 1' in middle and '"SEQ" < 4' in middle


@pytest.mark.django_db(transaction=True)
def test_sixteen_processes_appending_to_one_session_give_gapless_seqs():
    session_id = make_session()
    writers, each = 16, 500
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.sessions.emitter", session_id, str(w), str(each)],
            cwd=ROOT,
            env=child_env(),
        )
        for w in range(writers)
    ]
    assert [p.wait(timeout=600) for p in processes] == [0] * writers
    seqs = list(Event.objects.filter(session_id=session_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(writers * each))
    texts = {
        p["content"][0]["text"]
        for p in Event.objects.filter(session_id=session_id).values_list("payload", flat=True)
    }
    assert len(texts) == writers * each
    assert Session.objects.get(id=session_id).next_seq == writers * each


@pytest.mark.django_db(transaction=True)
def test_an_appended_event_is_broadcast_after_commit_stamped_with_session_and_seq(redis_url):
    import asyncio

    from channels.layers import channel_layers

    from sessions.broadcast import group_name

    session_id = make_session()
    layer = channel_layers.make_backend("default")

    async def scenario():
        channel = await layer.new_channel()
        await layer.group_add(group_name(session_id), channel)
        await asyncio.to_thread(in_thread, lambda: emit_event(session_id, message("a")))
        received = await asyncio.wait_for(layer.receive(channel), 10)
        rolled_back = False

        def in_rolled_back_transaction():
            nonlocal rolled_back
            try:
                with transaction.atomic():
                    emit_event(session_id, message("never"))
                    raise RuntimeError("roll back")
            except RuntimeError:
                rolled_back = True

        await asyncio.to_thread(in_thread, in_rolled_back_transaction)
        await asyncio.to_thread(in_thread, lambda: emit_event(session_id, message("b")))
        second = await asyncio.wait_for(layer.receive(channel), 10)
        return received, rolled_back, second

    received, rolled_back, second = asyncio.run(scenario())
    assert received["session"] == session_id and received["seq"] == 0
    assert received["event"]["content"][0]["text"] == "a"
    assert rolled_back
    assert second["seq"] == 1 and second["event"]["content"][0]["text"] == "b"


def check_a_users_append_sets_status_and_a_closed_session_refuses_it() -> None:
    from sessions.services import emit_events

    session_id = make_session()
    sent = emit_events(
        session_id, [(message("a"), None), (message("b"), None)], status="running", open_only=True
    )
    assert [e.seq for e in sent] == [0, 1] and Session.objects.get(id=session_id).status == "running"
    for field, value, state in (
        ("archived_at", "2026-01-01T00:00:00Z", "archived"),
        ("status", "terminated", "terminated"),
    ):
        closed = make_session()
        emit_event(closed, message("before"))
        Session.objects.filter(id=closed).update(**{field: value})
        with pytest.raises(SessionClosed, match=state):
            emit_events(closed, [(message("late"), None)], open_only=True)
        assert Session.objects.get(id=closed).next_seq == 1 and [e.seq for e in get_events(closed)] == [0]
        # A brain's own writes (a status event at close, say) are not a user's: they go in.
        assert emit_events(closed, [(message("brain"), None)])[0].seq == 1


@pytest.mark.django_db
def test_inside_a_transaction_a_users_append_sets_status_and_a_closed_session_refuses_it():
    check_a_users_append_sets_status_and_a_closed_session_refuses_it()


# Alone (outside a caller's transaction) an append on PostgreSQL is one statement; these run that path.


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_alone_a_users_append_sets_status_and_a_closed_session_refuses_it():
    require(on_postgres(), "the one-statement append is PostgreSQL's")
    check_a_users_append_sets_status_and_a_closed_session_refuses_it()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_alone_an_append_sets_status_keeps_keys_and_refuses_a_stale_epoch():
    require(on_postgres(), "the one-statement append is PostgreSQL's")
    from sessions.services import emit_events

    session_id = make_session()
    Session.objects.filter(id=session_id).update(lease_epoch=4)
    batch = [({"type": "session.status_running"}, None), (message("a"), "k:a"), (message("b"), "k:b")]
    first = emit_events(session_id, batch, epoch=4)
    assert [e.seq for e in first] == [0, 1, 2] and Session.objects.get(id=session_id).status == "running"
    assert [e.pk for e in first] == list(
        Event.objects.filter(session_id=session_id).order_by("seq").values_list("pk", flat=True)
    )
    again = emit_events(session_id, [(message("a2"), "k:a"), (message("b2"), "k:b")], epoch=4)
    assert [e.pk for e in again] == [first[1].pk, first[2].pk]
    with pytest.raises(StaleEpoch) as stale:
        emit_events(session_id, [(message("late"), None)], epoch=3)
    assert stale.value.current == 4
    assert Session.objects.get(id=session_id).next_seq == 3 and get_events(session_id)[-1].seq == 2
    Session.objects.filter(id=session_id).update(deleted_at="2026-01-01T00:00:00Z")
    with pytest.raises(SessionNotFound):
        emit_event(session_id, message("gone"))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_key_committed_while_an_append_waited_for_the_lock_returns_that_event():
    require(on_postgres(), "row locks and snapshots are PostgreSQL's")
    import threading
    import time

    session_id = make_session()
    holding, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def holder():
        with transaction.atomic():
            emit_event(session_id, message("first"), idempotency_key="k")
            holding.set()
            release.wait(30)

    def appender():
        outcome["event"] = emit_event(session_id, message("second"), idempotency_key="k")

    threads = [threading.Thread(target=in_thread, args=(holder,))]
    threads[0].start()
    assert holding.wait(30)
    threads.append(threading.Thread(target=in_thread, args=(appender,)))
    threads[1].start()
    deadline = time.monotonic() + 30
    with connection.cursor() as cursor:  # wait until the appender's statement queues behind the row lock
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the second append never waited for the session's lock")
    release.set()
    for thread in threads:
        thread.join(30)
    assert outcome["event"].seq == 0 and outcome["event"].payload["content"][0]["text"] == "first"
    assert [e.payload["content"][0]["text"] for e in get_events(session_id)] == ["first"]
    assert Session.objects.get(id=session_id).next_seq == 1


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_prepared_append_finds_used_keys_by_index_lookups_not_a_pass_over_the_session():
    """psycopg prepares the append; its generic plan, made while the table is small, must still look each
    key up by (session, key), or appends slow down as a session grows."""
    require(on_postgres(), "the plan is PostgreSQL's")
    import re

    from sessions.services.log import APPEND_KEYED

    names: list[str] = []

    def number(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    sql = re.sub(r"%\((\w+)\)s", number, APPEND_KEYED)
    types = {
        "session": "text",
        "keys": "text[]",
        "count": "int",
        "now": "timestamptz",
        "status": "text",
        "epoch": "bigint",
        "open_only": "boolean",
        "uids": "text[]",
        "types": "text[]",
        "payloads": "jsonb[]",
        "event_keys": "text[]",
        "actor": "text",
    }
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE keyed_append({', '.join(types[n] for n in names)}) AS {sql}")
        cursor.execute(f"EXPLAIN EXECUTE keyed_append({', '.join(['NULL'] * len(names))})")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE keyed_append")
    lookup = re.search(r"Index Cond: \(\(session_id = \$\d+\) AND \(idempotency_key = ", plan)
    assert lookup, plan
    assert "Hash Join" not in plan and "Filter: ((idempotency_key)" not in plan, plan


@pytest.mark.django_db(transaction=True)
def test_then_runs_once_the_events_are_committed_and_not_when_the_append_is_refused():
    from concurrent.futures import ThreadPoolExecutor

    from sessions.services import emit_events

    session_id = make_session()
    seen: list[int] = []

    def then() -> None:  # what another connection sees at that moment
        with ThreadPoolExecutor(1) as pool:
            seen.append(
                pool.submit(in_thread, lambda: Event.objects.filter(session_id=session_id).count()).result()
            )

    emit_events(session_id, [(message("a"), None), (message("b"), None)], then=then)
    assert seen == [2]
    Session.objects.filter(id=session_id).update(status="terminated")
    with pytest.raises(SessionClosed):
        emit_events(session_id, [(message("c"), None)], open_only=True, then=then)
    assert seen == [2]
