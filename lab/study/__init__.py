"""The GPU boot study behind ``lab/order_study.py``, split by job.

- ``models``: the config-only model shapes (dummy weights) and the engine arguments each is booted with;
- ``plan``: which boots a run wants (arms, orders, variants, ``--fill-to``);
- ``scheduler``: where and when each boot runs (GPUs, ``--per-gpu``, the deadline, stopping);
- ``boot``: one boot, a child process with its own environment (``vllm.LLM`` or ``vllm serve``);
- ``logs``: what an engine log says (staging crash, capture lines, faults, JIT-at-inference warnings);
- ``summary``: the tables printed from the boot records;
- ``validate``: the CPU check of every shape through vLLM's own config and argument classes.

``lab/order_study.py`` is the command line; ``lab/decode_bench.py`` reuses the shapes, the
arms' environments and the log analysis.
"""
