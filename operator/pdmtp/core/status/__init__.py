"""The status a reconcile writes, and the events that go with it.

- `builder`: one builder per condition, the role counts, the revision table, `waitingFor`.
- `conditions`: the condition setter (`metav1.Condition` semantics).
- `events`: which transitions and accepted actions earn an event.

Imports every other part of the core but `reconcile` (`make lint` holds this).
"""
