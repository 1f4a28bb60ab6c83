from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agent_sessions", "0003_session_wake_attempts"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="wake_queued_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
