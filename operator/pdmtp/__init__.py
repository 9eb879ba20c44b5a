"""pdmtp: a Kubernetes operator for vLLM prefill/decode serving with MTP speculative decoding."""

__version__ = "0.1.0"
