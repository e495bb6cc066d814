"""Task intake, as the master's doors call it: the one implementation is ``common/intake.py`` (the
workers' generator runs use it too)."""
from common.intake import add_tasks
from common.store.tasks import commit, reserve

__all__ = ["add_tasks", "commit", "reserve"]
