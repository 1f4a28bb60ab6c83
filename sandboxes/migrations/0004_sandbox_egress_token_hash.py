"""Sandboxes get the hash of the token they give the egress proxy as their identity."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sandboxes", "0003_environment_live_name_unique"),
    ]

    operations = [
        migrations.AddField(
            model_name="sandbox",
            name="egress_token_hash",
            field=models.CharField(blank=True, default="", editable=False, max_length=64),
        ),
    ]
