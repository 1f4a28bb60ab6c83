"""The rules about session rows as QuerySet methods, and the raw SQL that must agree with them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.utils import timezone

from harness.lease import lease_acquire
from sessions.models import Session
from tests.conftest import ROOT, make_session


def sessions_in_every_state() -> dict[str, str]:
    names = ["idle", "running", "archived", "terminated", "deleted", "archived_and_deleted"]
    ids = {name: make_session() for name in names}
    Session.objects.filter(id=ids["running"]).update(status=Session.Status.RUNNING)
    Session.objects.filter(id=ids["archived"]).update(archived_at=timezone.now())
    Session.objects.filter(id=ids["terminated"]).update(status=Session.Status.TERMINATED)
    Session.objects.filter(id=ids["deleted"]).update(deleted_at=timezone.now())
    Session.objects.filter(id=ids["archived_and_deleted"]).update(
        archived_at=timezone.now(), deleted_at=timezone.now()
    )
    return ids


def names_of(queryset, ids: dict[str, str]) -> set[str]:
    found = set(queryset.filter(id__in=ids.values()).values_list("id", flat=True))
    return {name for name, session_id in ids.items() if session_id in found}


@pytest.mark.django_db
def test_live_leaves_out_deleted_sessions_and_open_also_archived_and_terminated_ones():
    ids = sessions_in_every_state()
    assert names_of(Session.objects.live(), ids) == {"idle", "running", "archived", "terminated"}
    assert names_of(Session.objects.open(), ids) == {"idle", "running"}
    assert names_of(Session.objects.live().open(), ids) == {"idle", "running"}


@pytest.mark.django_db
def test_the_lease_is_taken_on_exactly_the_sessions_open_finds():
    ids = sessions_in_every_state()
    leased = {name for name, session_id in ids.items() if lease_acquire(session_id, owner="t", seconds=60)}
    assert leased == names_of(Session.objects.open(), ids)


def test_no_raw_sql_spells_a_table_name_of_its_own():
    """Raw SQL names tables through the models' `_meta` (the sessions tables': sessions.statements)."""
    from django.apps import apps

    tables = "|".join(sorted(model._meta.db_table for model in apps.get_models()))
    spelled = []
    for package in ("harness", "sessions", "sandboxes", "vault", "kernel", "workbench"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for number, line in enumerate(Path(path).read_text().splitlines(), 1):
                if re.search(rf"\b(FROM|JOIN|UPDATE|INTO)\s+({tables})\b", line):
                    spelled.append(f"{path.relative_to(ROOT)}:{number}")
    assert spelled == []
