# Reserved slot in the migration chain so parallel work could land in a fixed order.
# Worker health records (issue 9).

from django.db import migrations
from dispatch_app.store.triggers.migration_locks import BoundedMigration


class Migration(BoundedMigration):

    dependencies = [
        ("dispatch_app", "0007_operator_controls"),
    ]

    operations = []
