# Reserved slot in the migration chain so parallel work could land in a fixed order.
# Vendor-call ledger (issue 11 item 10).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("dispatch_app", "0003_notify_only_claimable"),
    ]

    operations = []
