"""Rendering: the children a PDDeployment's revisions need, as plain manifests.

- `children`: the engine and router Deployments, their pod templates, the shared children
  (Service, ServiceAccount, NetworkPolicy); `router` the router's argv, `membership` the engines
  a router lists (rendered, and read back from its pods); `weights` the weights source;
  `scheduling` the pod-level settings and placement; `budgets` the PodDisruptionBudgets;
  `history` the ControllerRevisions each revision's spec is recorded in (and read back from).

Imports only `groups` and the base modules: nothing that decides (`make lint` holds this).
"""
