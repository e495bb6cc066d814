"""Tests that start no services: no redis-server, no SecantusDB, no sample site, no subprocess
workers and no fixture that does (``cluster``, ``redis_server``, ``mongo_server``, ``site``).
The whole directory runs in under a minute (``make test-unit``)."""
