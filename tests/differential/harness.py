"""Settings shared by the harness's tests: a bounded, derandomized run in the fast tier, and
campaigns in the slow tier, which explore from the seed ``tests/conftest.py`` prints
(``DRAPPS_DIFF_SEED`` replays one; ``DRAPPS_DIFF_EXAMPLES`` sets its length)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FAST_EXAMPLES = int(os.environ.get("DRAPPS_DIFF_FAST", "25"))
"""Examples per test in the fast tier."""

FAST = settings(
    max_examples=FAST_EXAMPLES,
    deadline=None,
    derandomize=True,  # the fast tier is the same run every time; the campaigns explore
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)


def campaign(examples: int, **more: object) -> settings:
    """Settings of a campaign of ``examples`` examples (``DRAPPS_DIFF_EXAMPLES`` overrides)."""
    return settings(
        max_examples=int(os.environ.get("DRAPPS_DIFF_EXAMPLES", examples)),
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
        **more,  # type: ignore[arg-type]
    )
