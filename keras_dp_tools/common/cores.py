"""The CPU cores this process may run on.

Example:

```python
from keras_dp_tools.common.cores import usable_cores

print(usable_cores())  # 2 under `taskset -c 0,1`, on a machine of 64 cores
```
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: ``taskset``, a container's
    cpuset), which can be fewer than the machine's ``os.cpu_count()``.

    Returns:
        The number of usable cores; the machine's count where affinity is not known
        (not Linux).

    Example: see the module's.
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
