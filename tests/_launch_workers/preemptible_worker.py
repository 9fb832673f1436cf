"""A rank that stops like a preempted strategy: on SIGTERM (or after argv[2] seconds, rank r
0.3 s after rank r-1) it waits a little, as a rank finishing its round would, and exits 75 (or,
on rank 1 when argv[3] is "rank1-fails", exits 3; when argv[3] is "finishes", every rank hands
over its result and exits 0, as a rank does that was testing when the signal came)."""

import os
import signal
import sys
import time
from pathlib import Path

from lightning_cocod.exit_codes import PREEMPTED_EXIT_CODE

stop = False


def on_sigterm(signum, frame):
    global stop
    stop = True


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_sigterm)
    rank = int(os.environ["RANK"])
    Path(sys.argv[1], f"started.{rank}").write_text(str(os.getpid()))
    after = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "never" else None
    started = time.monotonic()
    while not stop and (after is None or time.monotonic() - started < after + 0.3 * rank):
        time.sleep(0.05)
    time.sleep(0.3)
    mode = sys.argv[3] if len(sys.argv) > 3 else None
    if mode == "finishes":
        from lightning_cocod.launch import write_result

        write_result({"rank": rank})
        sys.exit(0)
    sys.exit(3 if mode == "rank1-fails" and rank == 1 else PREEMPTED_EXIT_CODE)
