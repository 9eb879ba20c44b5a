"""PDRoleScale (pdmtp.io/v1alpha1): one External-autoscaled role's scale endpoint.

The operator creates `<name>-<role>` (owned by the PDDeployment) for each role whose
spec.autoscaling.<role>.source is External, and never writes its spec.replicas again: that is
the input an HPA, KEDA or `kubectl scale` sets through the scale subresource. The operator
writes its status (the role's live pods, and the label selector an HPA needs to find them) and
rolls the role to spec.replicas within minReplicas/maxReplicas and the prefill:decode band.
An Operator-scaled role has no PDRoleScale, so nothing outside can fight the operator's scaler.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from pdmtp.api import vocabulary as v
from pdmtp.api.base import Model


class PDRoleScaleSpec(Model):
    replicas: int = Field(
        ge=0,
        le=1000,
        description=(
            "The count asked for (by an HPA through /scale, or kubectl scale); the operator keeps "
            "the role within minReplicas/maxReplicas and the ratio band."
        ),
    )


class PDRoleScaleStatus(Model):
    model_config = ConfigDict(frozen=False)

    replicas: int = Field(default=0, description="Live pods of the role (every revision).")
    selector: str = Field(default="", description="Label selector of the role's pods (for HPA).")


class RoleScaleMeta(Model):
    name: str = Field(description="<PDDeployment>-<role>.")


class PDRoleScale(Model):
    """A role's scale endpoint; see the module docstring."""

    api_version: Literal["pdmtp.io/v1alpha1"] = Field(alias="apiVersion", description=v.API_VERSION)
    kind: Literal["PDRoleScale"] = Field(description=v.ROLE_SCALE_KIND)
    metadata: RoleScaleMeta = Field(description="Standard object metadata.")
    spec: PDRoleScaleSpec = Field(description="What the scaler asks for.")
    status: PDRoleScaleStatus | None = Field(default=None, description="Written by the operator.")
