"""Sample python downloader: fetch the page with urllib and return it untouched."""
import urllib.request


def download(task):
    with urllib.request.urlopen(task["url"], timeout=30) as resp:
        return {
            "status_code": resp.status,
            "headers": dict(resp.headers.items()),
            "body": resp.read(),
        }
