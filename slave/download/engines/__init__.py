"""Downloader engines: the built-in ones (aio: aiohttp, the default; http: requests; browser:
headless Chromium), the sandbox that runs a job's own python or shell downloader (sandbox,
sandbox_main, wall: its network rules), and what they share (base: results and limits; charset)."""
