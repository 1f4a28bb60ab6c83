"""Every vault belongs to a workspace; those made before workspaces existed go to the default one."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workbench", "0003_workspaces"),
        ("vault", "0002_repository_tokens_to_the_vault"),
    ]

    operations = [
        migrations.AddField(
            model_name="vault",
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
