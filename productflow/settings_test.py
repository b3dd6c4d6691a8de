"""Test settings: the normal settings, with test isolation knobs.

TEST_DATABASE_NAME picks the test database (so parallel runs do not collide);
PRODUCTFLOW_TEST_REDIS_DB picks the Redis database index the tests flush
(default 15, away from the demo's 0).
"""

import os
import re

from productflow.settings import *  # noqa: F403
from productflow.settings import REDIS_URL, RQ_QUEUES

_BASE_REDIS_URL = REDIS_URL
_test_db = os.environ.get("PRODUCTFLOW_TEST_REDIS_DB", "15")
if not os.environ.get("PRODUCTFLOW_KEEP_REDIS_DB"):
    if re.search(r"[?&]db=\d+", REDIS_URL):
        REDIS_URL = re.sub(r"([?&])db=\d+", rf"\g<1>db={_test_db}", REDIS_URL)
    elif REDIS_URL.startswith("unix://"):
        REDIS_URL = REDIS_URL + ("&" if "?" in REDIS_URL else "?") + f"db={_test_db}"
    else:
        REDIS_URL = re.sub(r"^(redis(?:s)?://[^/?]*)(/\d+)?", rf"\g<1>/{_test_db}", REDIS_URL)
for _queue in RQ_QUEUES.values():
    if _queue["URL"] == _BASE_REDIS_URL:  # a queue on its own Redis (REDIS_URL_<QUEUE>) keeps it
        _queue["URL"] = REDIS_URL

# Tests run with DEBUG off and usually no collectstatic: look into STATIC_ROOT per request (no start-up warning
# about a missing folder); a test that collects into a temp STATIC_ROOT is served from it.
WHITENOISE_AUTOREFRESH = True

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
