# Reserved slot in the migration chain so parallel work could land in a fixed order.
# Operator controls: per-domain pause and the like (issue 12).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("dispatch_app", "0006_job_attempts"),
    ]

    operations = []
