"""The README documents every setting with its default and every domain with its policy."""

import re

import pytest

from dispatch_app.config.settings import SPECS
from dispatch_app.domains.policy import KEYS, resolve_all
from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()


def _row(first_cell: str) -> str:
    """Every README table row starting with this cell (a key may appear in two tables)."""
    rows = re.findall(rf"^\| `{re.escape(first_cell)}` \|.*$", README, re.MULTILINE)
    assert rows, f"README has no table row for {first_cell}"
    return "\n".join(rows)


@pytest.mark.parametrize("key", list(SPECS))
def test_every_dispatch_setting_is_documented_with_its_default(key):
    assert f"`{SPECS[key].default!r}`" in _row(key)


@pytest.mark.parametrize("key", list(KEYS))
def test_every_recovery_key_is_documented(key):
    _row(key)


@pytest.mark.parametrize(("domain", "policy"), list(resolve_all({}).items()))
def test_every_domain_policy_is_documented_as_it_is(domain, policy):
    row = _row(domain)
    for key, spec in KEYS.items():
        assert f"`{getattr(policy, spec.field)!r}`" in row, f"{domain} {key}"


@pytest.mark.parametrize("command", ["make demo", "make test"])
def test_the_two_setup_commands_are_in_the_readme_and_the_makefile(command):
    assert command in README
    target = command.split()[1]
    assert re.search(rf"^{target}:", (ROOT / "Makefile").read_text(), re.MULTILINE)


def test_every_exported_metric_is_in_the_readme():
    from dispatch_app.housekeeping import metrics

    source = (ROOT / "dispatch_app" / "housekeeping" / "metrics.py").read_text()
    names = set(re.findall(r'"(productflow_[a-z_]+)"', source))
    assert names, f"no metric names found in {metrics.__file__}"
    # prometheus-client exposes a counter declared as "x" as "x_total".
    missing = sorted(n for n in names if f"`{n}`" not in README and f"`{n}_total`" not in README)
    assert not missing, f"metrics missing from the README: {missing}"
