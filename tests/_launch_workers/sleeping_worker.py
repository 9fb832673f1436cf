"""Announces itself with a file in argv[1], then never finishes."""

import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    Path(sys.argv[1], f"started.{os.environ['RANK']}").write_text(str(os.getpid()))
    while True:
        time.sleep(1)
