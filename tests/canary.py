"""A function a forged job may name: it appends a line to the file ``CANARY_ENV`` names.

Importable by every process of a test (workers included), so "the file does not exist" proves that
no forged call ran, as a function, a callback, or a dependent.
"""

from __future__ import annotations

import os

CANARY_ENV = "PRODUCTFLOW_TEST_CANARY"


def touch(*args, **kwargs) -> None:
    with open(os.environ[CANARY_ENV], "a") as f:
        f.write(f"ran with {args!r} {kwargs!r}\n")
