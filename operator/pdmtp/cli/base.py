"""What every subcommand shares, offline or not: the exit codes, the error that ends a command
unusable, and the cluster client. Light on purpose: `pdmtp run` imports this and nothing of
the offline tooling (`inputs` reads files through `pdmtp.tools`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

EXIT_COMPATIBLE = 0
EXIT_INCOMPATIBLE = 1
EXIT_UNUSABLE = 2


class UnusableInput(Exception):
    """The input cannot be used (a file that is no PDDeployment, no cluster to talk to); the
    message names the file and field, or the cause."""


def connect(kubeconfig: str | None) -> ApiClient:
    """The cluster client of --kubeconfig (default: in-cluster, then $KUBECONFIG), or
    UnusableInput: no cluster to talk to."""
    # Imported here: the offline commands must not need a cluster client.
    from pdmtp.kube import load_client

    try:
        return load_client(kubeconfig)
    except Exception as e:  # kubernetes.config raises several kinds; all mean "no cluster"
        raise UnusableInput(f"no cluster to talk to: {e}") from e
