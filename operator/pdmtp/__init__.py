"""pdmtp: a Kubernetes operator for vLLM prefill/decode serving with MTP speculative decoding."""

from importlib.metadata import PackageNotFoundError, version

try:
    # pyproject.toml's [project].version, the one place a release number is written.
    __version__ = version("pdmtp")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
