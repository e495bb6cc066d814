"""Dispatching: the seq cursor and retries (selection), the run (dispatcher), its lock, the defender."""
