"""The pure core: decisions over plain data. No kopf, no Kubernetes client, no clock, no env."""
