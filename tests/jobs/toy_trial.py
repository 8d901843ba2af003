"""A trial process without TensorFlow for the rounds machinery's tests: its spec's
``behaviour`` says what it does before its first answer ("ready", "raise", "contract",
"hang"), and each later command is answered at once."""

import os
import time

from keras_dp_tools.tools.tuning.child import ContractError, serve

PORT_ERROR = "port 4321 is in use"


def set_up(spec: dict) -> dict:
    behaviour = spec["behaviour"]
    if behaviour == "hang":
        time.sleep(3600)  # as worker 0 of a multi-worker strategy waits for its peer
    if behaviour == "raise":
        raise RuntimeError(PORT_ERROR)
    if behaviour == "contract":
        raise ContractError("make_dataset must take global_batch")
    growth = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")
    return {"ready": True, "replicas": 1, "strategy": "Toy", "allow_growth": growth}


def command(command: dict) -> dict:
    return {"steps": command.get("time", 0), "examples": 0, "seconds": 1.0}


if __name__ == "__main__":
    serve(set_up, command)
