"""The slave: rq worker entry, the batch job function and the downloader engines."""
