"""Tests against the real services in-process: the session's redis-server, SecantusDB and sample
site (the ``cluster`` fixture), a ``downcluster web`` process, local receivers and sandboxes."""
