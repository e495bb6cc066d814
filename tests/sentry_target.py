"""An rq job function that fails with secrets in its message and locals (for the Sentry test)."""


def boom(proxy: str, cookie: str) -> None:
    headers = {"Cookie": cookie, "Authorization": "Bearer tok-abcdef"}
    raise RuntimeError(f"download via {proxy} with cookie {cookie} failed ({len(headers)} headers)")
