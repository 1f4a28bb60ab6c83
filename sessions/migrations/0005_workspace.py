"""Every session belongs to a workspace; those made before workspaces existed go to the default one."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workbench", "0003_workspaces"),
        ("agent_sessions", "0004_session_wake_queued_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="session",
            name="workspace",
            field=models.ForeignKey(
                default="wrkspc_default",
                editable=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="workbench.workspace",
            ),
            preserve_default=False,
        ),
    ]
