"""Multi-node engine groups: a role whose replicas each span several pods (`multiNode`).

- `grouping`: the groups read off their pods and PodGroups, each counted as one unit.
- `podgroups`: a group's pods, its PodGroup (the Workload API's gang scheduling) and its headless
  Service, rendered.
- `actions`: the writes that create, repair or remove whole groups.

Imports only the base modules (`make lint` holds this).
"""
