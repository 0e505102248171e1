"""The operator's room: tools that run on the operator's machine, never inside a vLLM worker."""
