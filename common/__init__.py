"""Shared pieces of downcluster: configuration, models, queues, connections and errors."""
