"""Fork one rank per environment from one process that imported ``PRELOAD`` once (as vLLM forks its
workers: the ranks' environments may differ, their hash seed may not), run ``children.MODULE`` in each,
and print every rank's exit status and stdout as ``FORKED:<json>``.

    python -m children.fork_driver MODULE ENVS_JSON PRELOAD    # PRELOAD: comma-separated module names
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import threading
import traceback


def main(module: str, envs: list[dict[str, str]], preload: list[str]) -> None:
    for name in preload:  # the imports every rank needs, made once before the fork
        importlib.import_module(name)
    children = []
    for env in envs:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a rank: its own environment, its stdout into the pipe
            os.close(read)
            os.dup2(write, 1)
            os.environ.clear()
            os.environ.update(env)
            status = 0
            try:
                runpy.run_module(f"children.{module}", run_name="__main__")
            except BaseException:
                traceback.print_exc()
                status = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        os.close(write)
        children.append((pid, read))
    outputs = [""] * len(children)

    def drain(i: int, fd: int) -> None:
        with os.fdopen(fd) as pipe:
            outputs[i] = pipe.read()

    threads = [threading.Thread(target=drain, args=(i, fd)) for i, (_, fd) in enumerate(children)]
    for thread in threads:
        thread.start()
    statuses = [os.waitpid(pid, 0)[1] for pid, _ in children]
    for thread in threads:
        thread.join()
    ranks = [{"status": st, "stdout": out} for st, out in zip(statuses, outputs, strict=True)]
    print("FORKED:" + json.dumps(ranks))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), [n for n in sys.argv[3].split(",") if n])
