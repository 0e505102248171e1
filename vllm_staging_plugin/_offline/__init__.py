"""The operator's room: tools that run on the operator's machine (or the GPU host's shell), never inside a
vLLM worker: the CLI (:mod:`.cli`), the pre-flight (:mod:`.preflight`), the CPU replay of vLLM's capture
staging (:mod:`.cpu_replay`), the receipt reader and the report. They may import the engine part; the
engine part never imports them.
"""
