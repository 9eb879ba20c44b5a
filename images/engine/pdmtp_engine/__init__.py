"""The pdmtp engine image: vLLM's Mooncake connector with the MTP prefill backoff, and a
launcher that refuses to serve a configuration the operator did not expect."""
