"""The one place pdmtp reaches into kopf below its public API.

kopf's webhook server answers every review with an error until kopf's discovery has resolved the
resource it admits; whether it has is held in kopf's `Insights`, which `kopf.operator` accepts
(`insights=`) but kopf does not export at the top level. Importing it here, and nowhere else,
keeps a kopf upgrade that moves it to one failing test (tests/unit/test_kopfcompat.py).
"""

from __future__ import annotations

from collections.abc import Callable

from kopf._cogs.structs.references import Insights

__all__ = ["Insights", "resolves"]


def resolves(insights: Insights, group: str, plural: str) -> Callable[[], bool]:
    """Whether kopf's discovery has found `group`/`plural` among the resources its webhook
    admits, read at call time."""

    def resolved() -> bool:
        return any(r.group == group and r.plural == plural for r in insights.webhook_resources)

    return resolved
