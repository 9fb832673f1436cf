"""The ``cocod-train`` / ``cocod-report`` apps: config checks, run identity and folder claims,
loggers, the run records and the fit itself. Nothing here imports Lightning at module import
time, so the config checks of a bad command line answer in about a second."""
