"""A child that ignores SIGTERM and has a child of its own, in its own process group (stop_processes' worst case).
Its own module, so that a spawned copy imports nothing heavy."""

import os
import signal
import subprocess
import time


def stubborn(ready) -> None:
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen(["sleep", "60"])  # in its group: killed with it
    ready.set()
    time.sleep(60)
