"""Environment names become unique among live (not deleted) environments.

Rows that already share a name keep it on the oldest; each later one is renamed "<name> (<id>)", so the
index can be built on a database that took duplicates before, and every environment stays reachable by id.
"""

from django.db import migrations, models


def rename_duplicates(apps, schema_editor):  # type: ignore[no-untyped-def]
    Environment = apps.get_model("sandboxes", "Environment")
    seen: set[str] = set()
    for environment in Environment.objects.filter(deleted_at__isnull=True).order_by("created_at", "id"):
        if environment.name in seen:
            suffix = f" ({environment.id})"
            environment.name = environment.name[: 255 - len(suffix)] + suffix
            environment.save(update_fields=["name"])
        seen.add(environment.name)


class Migration(migrations.Migration):
    dependencies = [
        ("sandboxes", "0002_sandbox"),
    ]

    operations = [
        migrations.RunPython(rename_duplicates, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="environment",
            constraint=models.UniqueConstraint(
                condition=models.Q(("deleted_at__isnull", True)),
                fields=("name",),
                name="environment_live_name_unique",
            ),
        ),
    ]
