"""The master: job registry, task intake, dispatcher, defender, stats and export."""
