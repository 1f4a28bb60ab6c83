"""On PostgreSQL, every change to what the egress proxy caches tells it at commit (`NOTIFY workbench_egress`).

The proxy keeps a sandbox's policy (the credentials of the session holding it, the session's repository
tokens, its environment's networking) for EGRESS_CACHE_SECONDS. Without a word from the database, a sandbox
passed to another session could still use the previous holder's credentials until then, and an archived
credential could still be added. These triggers send the key of what changed, as `<kind>:<id>`, in the
changing transaction, so PostgreSQL delivers it when (and only if) it commits; `vault/egress/notices.py`
listens and the proxy forgets what the key names. Only the columns a policy is read from fire them (an
UPDATE OF list, then a WHEN on the values), so the hot updates (a session's next_seq, a credential's
last_used_at, a sandbox's last_used_at) send nothing.
"""

from django.db import migrations

CHANNEL = "workbench_egress"

FUNCTION = f"""
CREATE OR REPLACE FUNCTION workbench_egress_notice() RETURNS trigger AS $$
DECLARE
    changed jsonb := to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END);
BEGIN
    -- TG_ARGV: the kind of key, and the column that holds its id.
    PERFORM pg_notify('{CHANNEL}', TG_ARGV[0] || ':' || coalesce(changed ->> TG_ARGV[1], ''));
    IF TG_OP = 'UPDATE' AND TG_ARGV[1] <> 'id'
        AND (to_jsonb(OLD) ->> TG_ARGV[1]) IS DISTINCT FROM (changed ->> TG_ARGV[1]) THEN
        -- A row moved to another owner: the one it left is told too.
        PERFORM pg_notify('{CHANNEL}', TG_ARGV[0] || ':' || coalesce(to_jsonb(OLD) ->> TG_ARGV[1], ''));
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""

# (trigger, table, events, WHEN, kind, id column)
TRIGGERS = [
    (
        "sandbox_egress_notice",
        "sandboxes_sandbox",
        "UPDATE OF session_id, status, egress_token_hash, environment_id",
        "OLD.session_id IS DISTINCT FROM NEW.session_id OR OLD.status IS DISTINCT FROM NEW.status"
        " OR OLD.egress_token_hash IS DISTINCT FROM NEW.egress_token_hash"
        " OR OLD.environment_id IS DISTINCT FROM NEW.environment_id",
        "sandbox",
        "id",
    ),
    ("sandbox_gone_egress_notice", "sandboxes_sandbox", "DELETE", "", "sandbox", "id"),
    (
        "environment_egress_notice",
        "sandboxes_environment",
        "UPDATE OF config",
        "OLD.config IS DISTINCT FROM NEW.config",
        "environment",
        "id",
    ),
    (
        "session_egress_notice",
        "agent_sessions_session",
        "UPDATE OF vault_ids, agent_snapshot, deleted_at",
        "OLD.vault_ids IS DISTINCT FROM NEW.vault_ids OR OLD.deleted_at IS DISTINCT FROM NEW.deleted_at"
        " OR OLD.agent_snapshot IS DISTINCT FROM NEW.agent_snapshot",
        "session",
        "id",
    ),
    (
        "vault_egress_notice",
        "vault_vault",
        "UPDATE OF archived_at, deleted_at",
        "OLD.archived_at IS DISTINCT FROM NEW.archived_at OR OLD.deleted_at IS DISTINCT FROM NEW.deleted_at",
        "vault",
        "id",
    ),
    (
        "credential_egress_notice",
        "vault_credential",
        "UPDATE OF sealed, secret_version, auth, kind, secret_name, mcp_server, vault_id, archived_at,"
        " deleted_at",
        "OLD.secret_version IS DISTINCT FROM NEW.secret_version OR OLD.sealed IS DISTINCT FROM NEW.sealed"
        " OR OLD.auth IS DISTINCT FROM NEW.auth OR OLD.kind IS DISTINCT FROM NEW.kind"
        " OR OLD.secret_name IS DISTINCT FROM NEW.secret_name OR OLD.mcp_server IS DISTINCT FROM NEW.mcp_server"
        " OR OLD.vault_id IS DISTINCT FROM NEW.vault_id OR OLD.archived_at IS DISTINCT FROM NEW.archived_at"
        " OR OLD.deleted_at IS DISTINCT FROM NEW.deleted_at",
        "vault",
        "vault_id",
    ),
    ("credential_added_egress_notice", "vault_credential", "INSERT OR DELETE", "", "vault", "vault_id"),
    (
        "repository_secret_egress_notice",
        "vault_repositorysecret",
        "INSERT OR UPDATE OR DELETE",
        "",
        "session",
        "session_id",
    ),
]


def _create(trigger: str, table: str, events: str, when: str, kind: str, column: str) -> str:
    condition = f"WHEN ({when})" if when else ""
    return (
        f"CREATE TRIGGER {trigger} AFTER {events} ON {table} FOR EACH ROW {condition} "
        f"EXECUTE FUNCTION workbench_egress_notice('{kind}', '{column}');"
    )


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return  # SQLite: the proxy keeps a policy for EGRESS_CACHE_SECONDS, as it always did
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(FUNCTION)
        for trigger in TRIGGERS:
            cursor.execute(_create(*trigger))


def backward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for trigger, table, *_ in TRIGGERS:
            cursor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table};")
        cursor.execute("DROP FUNCTION IF EXISTS workbench_egress_notice();")


class Migration(migrations.Migration):
    dependencies = [
        ("vault", "0003_workspace"),
        ("sandboxes", "0008_sandbox_provisioning_index"),
        ("agent_sessions", "0007_session_wake_step_attempts"),
    ]
    operations = [migrations.RunPython(forward, backward)]
