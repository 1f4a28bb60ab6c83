"""The self-hosted work queue: work items (one live per session), environment keys, the workers seen polling."""

import functools

import django.db.models.deletion
from django.db import migrations, models

import kernel.ids


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0004_session_wake_queued_at"),
        ("sandboxes", "0004_sandbox_egress_token_hash"),
    ]

    operations = [
        migrations.CreateModel(
            name="EnvironmentKey",
            fields=[
                (
                    "id",
                    models.CharField(
                        default=functools.partial(kernel.ids.new_id, *("envkey",), **{}),
                        editable=False,
                        max_length=40,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("name", models.CharField(blank=True, default="", max_length=200)),
                (
                    "prefix",
                    models.CharField(help_text="The first characters, to recognise a key.", max_length=16),
                ),
                ("key_hash", models.CharField(editable=False, max_length=64, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("last_used_at", models.DateTimeField(blank=True, null=True)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                (
                    "environment",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="keys",
                        to="sandboxes.environment",
                    ),
                ),
            ],
            options={
                "ordering": ["created_at", "id"],
            },
        ),
        migrations.CreateModel(
            name="WorkItem",
            fields=[
                (
                    "id",
                    models.CharField(
                        default=functools.partial(kernel.ids.new_id, *("work",), **{}),
                        editable=False,
                        max_length=40,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                (
                    "kind",
                    models.CharField(
                        choices=[("session", "Session"), ("healthcheck", "Healthcheck")],
                        default="session",
                        max_length=20,
                    ),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("queued", "Queued"),
                            ("starting", "Starting"),
                            ("active", "Active"),
                            ("stopping", "Stopping"),
                            ("stopped", "Stopped"),
                        ],
                        default="queued",
                        max_length=20,
                    ),
                ),
                ("metadata", models.JSONField(blank=True, default=dict)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("queued_at", models.DateTimeField(auto_now_add=True)),
                ("polled_at", models.DateTimeField(blank=True, null=True)),
                ("polled_by", models.CharField(blank=True, default="", max_length=200)),
                ("acknowledged_at", models.DateTimeField(blank=True, null=True)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("latest_heartbeat", models.CharField(blank=True, default="", max_length=64)),
                ("latest_heartbeat_at", models.DateTimeField(blank=True, null=True)),
                ("ttl_seconds", models.PositiveIntegerField(default=0)),
                ("lease_expires_at", models.DateTimeField(blank=True, null=True)),
                ("worker_id", models.CharField(blank=True, default="", max_length=200)),
                ("stop_requested_at", models.DateTimeField(blank=True, null=True)),
                ("stopped_at", models.DateTimeField(blank=True, null=True)),
                ("lost_count", models.PositiveIntegerField(default=0)),
                ("token_hash", models.CharField(blank=True, default="", editable=False, max_length=64)),
                ("offered_token_hashes", models.JSONField(blank=True, default=list, editable=False)),
                ("retired_token_hashes", models.JSONField(blank=True, default=list, editable=False)),
                (
                    "environment",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="work_items",
                        to="sandboxes.environment",
                    ),
                ),
                (
                    "session",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="work_items",
                        to="agent_sessions.session",
                    ),
                ),
            ],
            options={
                "ordering": ["created_at", "id"],
                "indexes": [
                    models.Index(fields=["environment", "state", "queued_at"], name="work_item_queue")
                ],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("state", "stopped"), _negated=True),
                        fields=("session",),
                        name="work_item_one_live_per_session",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkPoller",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("worker_id", models.CharField(max_length=200)),
                ("last_polled_at", models.DateTimeField()),
                (
                    "environment",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="pollers",
                        to="sandboxes.environment",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("environment", "worker_id"), name="work_poller_per_environment"
                    )
                ],
            },
        ),
    ]
