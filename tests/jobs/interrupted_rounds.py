"""Runs ``run_in_rounds`` over a candidate whose two processes hang (as a multi-worker
candidate's workers wait for a lost peer), for the Ctrl-C test: ``python
interrupted_rounds.py LOG_DIR``; prints "waiting" once its trials are started."""

import sys
from pathlib import Path

from keras_dp_tools.tools.tuning.rounds import Launch, run_in_rounds

if __name__ == "__main__":
    log_dir = Path(sys.argv[1])
    spec = {"behaviour": "hang", "log_dir": str(log_dir)}
    launches = {
        "hanging": [
            Launch("tests.jobs.toy_trial", spec, log_dir / f"worker-{index}.log")
            for index in range(2)
        ]
    }

    def say(line: str) -> None:
        print("waiting" if line.startswith("started") else line, flush=True)

    run_in_rounds(launches, block=1, rounds=1, timeout=600, say=say, log_dir=log_dir)
