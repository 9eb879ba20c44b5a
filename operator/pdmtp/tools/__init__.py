"""Offline tooling, outside the operator's runtime layers: what the CLI and `make` run and the
running operator never imports.

- `yamlread`: a manifest file read as kubectl reads it (`pdmtp validate`, `render`, `plan`).
- `simulate`: the simulated cluster that drives the rollout planner (`pdmtp plan`, the tests).
- `reference`: docs/api-reference.md, generated from the CRD and the reasons table.
- `readme`: README.md's generated tables (`python -m pdmtp.tools.readme`, `make generate`).

They import the pure core and the API only; the CLI imports them.
"""
