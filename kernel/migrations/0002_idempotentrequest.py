import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workbench", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="IdempotentRequest",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=255)),
                ("fingerprint", models.CharField(max_length=64)),
                ("status", models.PositiveSmallIntegerField(blank=True, null=True)),
                ("body", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField(auto_now_add=True, db_index=True)),
                (
                    "api_key",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="idempotent_requests",
                        to="workbench.apikey",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("api_key", "key"), name="idempotency_key_per_api_key")
                ],
            },
        ),
    ]
