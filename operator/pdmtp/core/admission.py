"""What the validating admission webhook says about a PDDeployment: the same agreement rules the
operator applies, so `kubectl apply` fails before anything is stored (CEL stays the first line)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core.agreement import check


def admission_problems(body: Mapping[str, Any]) -> list[str]:
    """Reasons to refuse `body`, one line each; empty means admit."""
    try:
        pdd = PDDeployment.model_validate({**body, "status": None})
    except ValidationError as e:
        return [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
    return [f"{f.reason}: {f.message}" for f in check(pdd.spec).findings]
