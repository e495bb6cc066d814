"""The master: job registration, task intake, dispatching, maintenance, operations, exports and the web."""
