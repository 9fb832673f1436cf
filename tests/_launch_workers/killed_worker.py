"""Rank 0 ends itself with SIGKILL, as the kernel's OOM killer ends a process; rank 1 waits."""

import os
import signal
import sys
import time

if __name__ == "__main__":
    if os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(sys.argv[1]))
