"""The README's table of per-queue task options says what the code does."""

import re

import pytest

from dispatch_app.domains.base import RecoveryPolicy
from dispatch_app.tasks.declare import QUEUE_KEYS
from tests.helpers import ROOT

pytestmark = pytest.mark.version_dependent

README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("key", list(QUEUE_KEYS))
def test_every_queue_option_is_documented_with_its_default(key):
    default = getattr(RecoveryPolicy(), QUEUE_KEYS[key][0])
    assert re.search(rf"^\| `{key}` \| `{re.escape(repr(default))}` \|", README, re.MULTILINE), key
