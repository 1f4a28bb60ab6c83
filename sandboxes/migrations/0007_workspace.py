"""Every environment belongs to a workspace; those made before workspaces existed go to the default one."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workbench", "0003_workspaces"),
        ("sandboxes", "0006_work_item_hooks_due"),
    ]

    operations = [
        migrations.AddField(
            model_name="environment",
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
        migrations.RemoveConstraint(model_name="environment", name="environment_live_name_unique"),
        migrations.AddConstraint(
            model_name="environment",
            constraint=models.UniqueConstraint(
                condition=models.Q(("deleted_at__isnull", True)),
                fields=("workspace", "name"),
                name="environment_live_name_unique",
            ),
        ),
    ]
