# Reserved slot in the migration chain so parallel work could land in a fixed order.
# Per-attempt history (issue 12).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("dispatch_app", "0005_conditional_notify"),
    ]

    operations = []
