import pytest
from django.core.exceptions import ImproperlyConfigured

from dispatch_app.config.settings import dispatch_settings, validate


def test_defaults_are_valid():
    conf = validate({})
    assert conf.BATCH_SIZE == 100
    assert conf.POLL_INTERVAL == 1.0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"BATCH_SIZ": 10}, "did you mean 'BATCH_SIZE'"),
        ({"BATCH_SIZE": 0}, "DISPATCH['BATCH_SIZE'] must be >= 1"),
        ({"BATCH_SIZE": 2.5}, "DISPATCH['BATCH_SIZE'] must be a whole number"),
        ({"POLL_INTERVAL": "fast"}, "DISPATCH['POLL_INTERVAL'] must be a number"),
        ({"SEND_CONCURRENCY": True}, "DISPATCH['SEND_CONCURRENCY'] must be a number"),
        ({"SEND_BACKOFF_BASE": 10, "SEND_BACKOFF_MAX": 5}, "SEND_BACKOFF_MAX"),
        ({"POLL_INTERVAL": float("nan")}, "DISPATCH['POLL_INTERVAL'] must be a number, got nan"),
        ({"BATCH_SIZE": float("inf")}, "DISPATCH['BATCH_SIZE'] must be a number, got inf"),
    ],
)
def test_bad_values_name_the_setting(raw, message):
    with pytest.raises(ImproperlyConfigured, match=__import__("re").escape(message)):
        validate(raw)


def test_settings_are_read_lazily(settings):
    settings.DISPATCH = {"BATCH_SIZE": 7}
    assert dispatch_settings().BATCH_SIZE == 7
    assert dispatch_settings(BATCH_SIZE=9).BATCH_SIZE == 9
