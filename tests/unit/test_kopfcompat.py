"""The adapter over kopf's private Insights works with the kopf that is installed: the webhook's
readiness reads it, so a kopf that moved or reshaped it must fail here, not in a cluster."""

from __future__ import annotations

import kopf
from pdmtp.api import vocabulary as v
from pdmtp.kopfcompat import Insights, resolves


def test_the_pddeployments_resolve_once_kopf_discovers_them() -> None:
    insights = Insights()
    resolved = resolves(insights, v.GROUP, v.PLURAL)
    assert not resolved()
    insights.webhook_resources.add(kopf.Resource("apps", "v1", "deployments"))
    assert not resolved()
    insights.webhook_resources.add(kopf.Resource(v.GROUP, v.VERSION, v.PLURAL))
    assert resolved()


def test_kopf_operator_still_takes_an_insights() -> None:
    import inspect

    assert "insights" in inspect.signature(kopf.operator).parameters
