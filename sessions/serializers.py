"""Sessions as the /v1 API returns them (reference §6.2)."""

from __future__ import annotations

from typing import Any

from sessions.models import Session


def session_json(session: Session) -> dict[str, Any]:
    active = session.usage.get("active_seconds")
    return {
        "id": session.id,
        "type": "session",
        "status": session.status,
        "agent": session.agent_snapshot,
        "environment_id": session.environment_id,
        "title": session.title,
        "metadata": session.metadata,
        "resources": session.shown_resources(),
        "vault_ids": session.vault_ids,
        "budget": session.budget,
        "outcome_evaluations": [],
        "stats": {
            "active_seconds": active,
            "duration_seconds": (session.updated_at - session.created_at).total_seconds(),
        },
        "usage": session.usage,
        "deployment_id": None,
        "created_at": session.created_at.isoformat(),
        "updated_at": session.updated_at.isoformat(),
        "archived_at": session.archived_at.isoformat() if session.archived_at else None,
    }
