"""Build preflight (``rocwheels wheels --preflight``): everything a build does up to its
compilation, then a sample of the recipe's own translation units compiled per target, each
measured (peak memory, seconds) and projected onto the full build.

``job.py`` does the work for one recipe wherever it runs (this host, or the builder image through
``rocwheels preflight-job``); ``drivers.py`` wraps it for the two drivers; ``measure.py`` is the
small process each unit compiles under; ``report.py`` holds the report, its projection and table.
"""
