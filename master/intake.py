"""Task intake, as the master's doors call it: the one implementation is ``common/intake.py`` (the
workers' generator runs use it too)."""
from common.intake import CHUNK, IntakeReport, add_tasks, parse_lines, preview
from common.store.tasks import commit, reserve

__all__ = ["CHUNK", "IntakeReport", "add_tasks", "commit", "parse_lines", "preview", "reserve"]
