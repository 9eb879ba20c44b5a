"""An emulated vLLM engine for tests: the slice of vLLM's OpenAI server and Mooncake bootstrap
server that vllm-router touches, plus a stand-in for the KV transfer between a prefill and a
decode. Used in-process by the router tier (tests/router) and, packaged as
`localhost/pdmtp-engine-emulator`, as the engine of PDDeployments in the kind e2e (tests/e2e)."""
