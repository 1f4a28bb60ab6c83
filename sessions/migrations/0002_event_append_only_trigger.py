"""On PostgreSQL the database itself refuses to change or remove an event, whoever asks."""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION workbench_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only: % on agent_sessions_event is refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER event_append_only
    BEFORE UPDATE OR DELETE ON agent_sessions_event
    FOR EACH ROW EXECUTE FUNCTION workbench_event_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS event_append_only ON agent_sessions_event;
DROP FUNCTION IF EXISTS workbench_event_append_only();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("agent_sessions", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
