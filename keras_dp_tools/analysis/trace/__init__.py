"""Reading profiler traces: the XPlane proto, streamed line by line, and the step markers.

Parsing only; what the events mean for a step is decided by the rest of ``analysis``.

May import: ``common``, ``records``.
"""
