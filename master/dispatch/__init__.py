"""Dispatching: the run (dispatcher), its lock, the defender, the schedule; which tasks are due is
common/store/tasks.py."""
