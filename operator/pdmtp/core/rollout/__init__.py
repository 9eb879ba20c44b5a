"""The rollout: how a PDDeployment moves from the revision that serves to the one its spec asks
for, one safe step at a time.

- `planner`: the step (surge, unavailability, the availability floor, drains), over plain
  `RevisionState`s (`core.revision_state`); `states` reads those off the Deployments and pods.
- `steering`: what the step aims at (the spec's target, or back after a failure; held for a
  canary, a pause or a verdict).
- `removal`: a pod leaves routing before it leaves the cluster (mark, release, scale);
  `evacuation`: pods on cordoned nodes, or marked for replacement, move first.
- `invariants`: the rollout invariants, checked at every moment of a simulation and watch.

Imports only the parts below it: `context`, `render`, `groups` and the base modules;
never `verification` (beside it: the verdict's effect reaches it as a `Gate`), `status` or
`reconcile`, which read it (`make lint` holds this).
"""
