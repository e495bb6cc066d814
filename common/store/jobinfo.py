"""The jobs as the dispatcher, the workers and ``stats`` read them: ``job``,
``crawler_download``, ``crawler_download_setting`` and ``crawler_download_type``, read only
(registering and changing jobs is the registry's).

Indexes: ``job`` (status, priority) finds the ON jobs; ``crawler_download`` and
``crawler_download_setting`` are unique on ``job``, so each lookup here is one index read.

Invariant: nothing here writes; each function is one read per collection it names, whatever
the number of tasks.
"""
from __future__ import annotations

from common.store.models import OFF, ON, CrawlerDownload, CrawlerDownloadSetting, CrawlerDownloadType, Job


def on_jobs() -> list[dict]:
    """The ON jobs, each with ``name``, ``priority``, ``host`` and its cursor fields (``seq_sent``,
    ``seq_next``, ``intake``: ``common.store.tasks``)."""
    fields = {"name": 1, "priority": 1, "host": 1, "seq_sent": 1, "seq_next": 1, "intake": 1}
    return list(Job._get_collection().find({"status": ON}, fields))


def dispatch_settings(job_ids: list) -> dict:
    """{job id: its settings document's ``dispatch_num``, ``max_retry_times`` and ``prior``}."""
    return {s["job"]: s for s in CrawlerDownloadSetting._get_collection().find(
        {"job": {"$in": job_ids}}, {"job": 1, "dispatch_num": 1, "max_retry_times": 1, "prior": 1})}


def names() -> dict:
    """{job id: name} of every job."""
    return {j["_id"]: j["name"] for j in Job._get_collection().find({}, {"name": 1})}


def context(job_id) -> dict | None:
    """What a worker needs of a job (None if it is gone): ``name``; ``status`` (OFF when its
    downloader is); ``download_id`` and ``code`` of its downloader; ``language`` of its type
    ("none": the built-in engine) and whether that type is ``supported``; ``settings``, its
    settings document (``{}`` if none)."""
    job = Job._get_collection().find_one({"_id": job_id}, {"name": 1, "status": 1})
    if job is None:
        return None
    download = CrawlerDownload._get_collection().find_one({"job": job_id})
    conf = CrawlerDownloadSetting._get_collection().find_one({"job": job_id}) or {}
    language, supported = "none", True
    if download is not None and download.get("types"):
        t = CrawlerDownloadType._get_collection().find_one({"_id": download["types"]},
                                                           {"language": 1, "is_support": 1})
        language = t["language"] if t else "none"
        supported = t is None or t.get("is_support", "support") == "support"
    off = download is not None and download.get("status") == OFF
    return {"name": job["name"], "status": OFF if off else job.get("status", OFF),
            "download_id": download["_id"] if download else None, "code": (download or {}).get("code", ""),
            "language": language, "supported": supported, "settings": conf}
