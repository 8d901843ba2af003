"""The analysis runner: the one door from capture into the analysis.

A callback hands a finished profiler window (its trace and ``RunFacts``) or a finished
run (its records) to the runner and gets the result back; it holds no analysis itself.
"""
