"""The queues: names and priorities, the rq adapter, the retry policy."""
