"""A rank that stops like a preempted strategy: on SIGTERM (or after argv[2] seconds, rank r
0.3 s after rank r-1) it waits a little, as a rank finishing its round would, and exits 75 (or,
on rank 1 when argv[3] is "rank1-fails", exits 3)."""

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
    after = float(sys.argv[2]) if len(sys.argv) > 2 else None
    started = time.monotonic()
    while not stop and (after is None or time.monotonic() - started < after + 0.3 * rank):
        time.sleep(0.05)
    time.sleep(0.3)
    fails = len(sys.argv) > 3 and sys.argv[3] == "rank1-fails" and rank == 1
    sys.exit(3 if fails else PREEMPTED_EXIT_CODE)
