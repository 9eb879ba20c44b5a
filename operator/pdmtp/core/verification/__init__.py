"""Verification: whether a revision's P/D path works, judged on what its decodes did.

- `verdict`: one revision's verdict from its decodes' scrapes (KV pulled, the backoff
  recomputed, receives failed, accepted tokens per draft).
- `revisions`: every revision's verdict, what the spec's mode makes of the update revision's,
  and the serving decodes whose pulls keep failing (replaced).
- `probing`: the operator's own requests while a verdict waits for traffic.

Beside `rollout` and `scaling`, independent of both: it reads the revisions as
`core.revision_state` holds them and hands the rollout its `Gate` (defined there too). Imports
only `context`, `render`, `groups` and the base modules (the layers contract in pyproject.toml;
`make lint` holds it).
"""
