"""The worker: its loop, one entry's run, rq's view of it, heartbeats, a job's context, the writer."""
