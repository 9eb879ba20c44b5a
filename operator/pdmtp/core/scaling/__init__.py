"""Scaling: how many replicas each engine role wants, which a rollout then reaches.

- `autoscaler`: the elastic P/D decision over the engines' scraped metrics (pure arithmetic),
  in steps: the signals read (`signals`), HPA's behaviour (`behavior`: stabilisation, step
  limits), min/max, and the prefill:decode band (`ratio`).
- `roles`: the autoscaler's step for a PDDeployment (its status, its events), and the PDRoleScale
  objects whose scale subresource lets an HPA or KEDA set a role's count instead.

Beside `rollout` and `verification`, independent of both; imports only the base modules (`make
lint` holds this).
"""
