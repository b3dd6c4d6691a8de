# Reserved slot in the migration chain so parallel work could land in a fixed order.
# NOTIFY only when a dispatcher is armed (issue 10 part 1).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("dispatch_app", "0004_vendor_calls"),
    ]

    operations = []
