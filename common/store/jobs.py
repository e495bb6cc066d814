"""Jobs and what registration stores with them: ``job``, ``crawler_download`` (a job's code and
downloader type), ``crawler_download_type`` (the languages the cluster runs),
``crawler_download_setting`` (a job's settings) and, on the log alias,
``crawler_registration_error_log`` (rejected registrations).

Indexes: ``job`` is unique on ``name`` and indexed by ``(status, priority)`` (the dispatcher's
order of ON jobs); ``crawler_download`` and ``crawler_download_setting`` are unique on ``job``;
``crawler_download_type`` on ``language``.
Invariant: a registered job has exactly one download and one settings document; a rejected
registration stores nothing but its log line. The report fields of a job (``report_counts``,
``alert_mail_at``) change only by compare-and-set, so one run of many sends each mail.
"""
from __future__ import annotations

from datetime import datetime

from common.store.models import (
    OFF,
    ON,
    CrawlerDownload,
    CrawlerDownloadSetting,
    CrawlerDownloadType,
    CrawlerRegistrationErrorLog,
    Job,
    job_named,
    utcnow,
)


def named(name) -> Job:
    """The job called ``name`` (a plain string, looked up as a literal), or NotFound."""
    return job_named(name)


def find(name: str) -> Job | None:
    """The job called ``name``, or None."""
    return Job.objects(name=name).first()


def ordered() -> list[Job]:
    """Every job, by priority then name."""
    return list(Job.objects.order_by("priority", "name"))


def names() -> dict:
    """Every job's name by its id."""
    return {j["_id"]: j["name"] for j in Job._get_collection().find({}, {"name": 1})}


def name_of(job_id) -> str:
    """The name of job ``job_id`` (its id as text if it is gone)."""
    job = Job._get_collection().find_one({"_id": job_id}, {"name": 1})
    return job["name"] if job else str(job_id)


def exists(job_id) -> bool:
    return Job.objects(id=job_id).only("id").first() is not None


def set_status(job: Job, status: str) -> Job:
    """Turn a job ON or OFF; the job as stored after."""
    job.update(set__status=status, set__last_update_datetime=utcnow())
    job.reload()
    return job


# --- registration ------------------------------------------------------------------------

def ensure_types(languages) -> None:
    """Create the supported downloader type rows of ``languages`` the first time they are needed."""
    for language in languages:
        CrawlerDownloadType.objects(language=language).update_one(
            set_on_insert__is_support="support", set_on_insert__add_datetime=utcnow(), upsert=True
        )


def download_type(language: str) -> CrawlerDownloadType:
    return CrawlerDownloadType.objects.get(language=language)


def store(name: str, priority: int, host: str, code: str, dtype, fields: dict,
          project: int | None = None, follow: dict | None = None) -> tuple[Job, bool]:
    """Create or update job ``name`` (in ``project``, if given), its download (``code`` of type
    ``dtype``), its settings (``fields``) and what it follows (``follow``, the checked
    ``[follow]`` table; None: nothing); (job, created)."""
    now = utcnow()
    job = Job.objects(name=name).first()
    created = job is None
    job = job or Job(name=name, add_datetime=now)
    job.priority, job.host, job.follow, job.last_update_datetime = priority, host, follow, now
    if project is not None:
        job.project = project
    job.save()
    download = CrawlerDownload.objects(job=job).first() or CrawlerDownload(job=job, add_datetime=now)
    download.code, download.types, download.status, download.last_update_datetime = code, dtype, ON, now
    download.save()
    setting = CrawlerDownloadSetting.objects(job=job).first()
    setting = setting or CrawlerDownloadSetting(job=job, add_datetime=now)
    for key, value in fields.items():
        setattr(setting, key, value)
    setting.last_update_datetime = now
    setting.save()
    return job, created


def log_rejected(name: str, manifest: str, reason: str, hostname: str) -> None:
    CrawlerRegistrationErrorLog(name=name, manifest=manifest, reason=reason, hostname=hostname).save()


def type_rows() -> list[dict]:
    """Every downloader type, whether it is supported, and how many jobs use it."""
    used: dict = {}
    for row in CrawlerDownload._get_collection().aggregate([{"$group": {"_id": "$types", "n": {"$sum": 1}}}]):
        used[row["_id"]] = row["n"]
    return [{"language": t.language, "is_support": t.is_support, "jobs": used.get(t.id, 0),
             "add_datetime": t.add_datetime} for t in CrawlerDownloadType.objects.order_by("language")]


def set_support(language: str, supported: bool) -> None:
    support = "support" if supported else "unsupport"
    CrawlerDownloadType.objects(language=language).update_one(set__is_support=support)


def type_names() -> dict:
    """Each job's downloader language by job id."""
    kinds = {d["job"]: d["types"] for d in CrawlerDownload._get_collection().find({}, {"job": 1, "types": 1})}
    languages = {t.id: t.language for t in CrawlerDownloadType.objects}
    return {job_id: languages.get(kind, "?") for job_id, kind in kinds.items()}


def settings_of(job: Job) -> CrawlerDownloadSetting | None:
    return CrawlerDownloadSetting.objects(job=job).first()


def code_chars(job: Job) -> int:
    """How long the job's code is (0 if it has no download)."""
    d = CrawlerDownload.objects(job=job).only("code").first()
    return len(d.code) if d else 0


# --- report mails ------------------------------------------------------------------------

def reported() -> list[tuple[dict, str]]:
    """(job, report_mails) of every job with report mails: the job's name and report fields."""
    out = []
    for s in CrawlerDownloadSetting._get_collection().find({"report_mails": {"$nin": ["", None]}},
                                                            {"job": 1, "report_mails": 1}):
        job = Job._get_collection().find_one({"_id": s["job"]},
                                             {"name": 1, "report_counts": 1, "alert_mail_at": 1})
        if job is not None:
            out.append((job, s["report_mails"]))
    return out


def claim_summary(job: dict, counts: dict, now: datetime) -> bool:
    """Record ``counts`` as the job's reported summary unless another run did first; whether this one did."""
    done = Job._get_collection().update_one({"_id": job["_id"], "report_counts": job.get("report_counts")},
                                            {"$set": {"report_counts": counts, "report_at": now}})
    return bool(done.modified_count)


def claim_alert(job: dict, last, now: datetime) -> bool:
    """Record an alert mail at ``now`` unless another run did since ``last``; whether this one did."""
    return bool(Job._get_collection().update_one({"_id": job["_id"], "alert_mail_at": last},
                                                 {"$set": {"alert_mail_at": now}}).modified_count)


# --- what the dispatcher and the workers read (one read per collection named, whatever the
# number of tasks) ---

def on_jobs() -> list[dict]:
    """The ON jobs, each with ``name``, ``priority``, ``host`` and its cursor fields (``seq_sent``,
    ``seq_next``, ``intake``, ``revisit_from``, ``revisit_from_id``: ``common.store.tasks``)."""
    fields = {"name": 1, "priority": 1, "host": 1, "seq_sent": 1, "seq_next": 1, "intake": 1,
              "revisit_from": 1, "revisit_from_id": 1}
    return list(Job._get_collection().find({"status": ON}, fields))


def off_ids() -> list:
    """The ids of the jobs that are OFF."""
    return [j["_id"] for j in Job._get_collection().find({"status": OFF}, {"_id": 1})]


def dispatch_settings(job_ids: list) -> dict:
    """{job id: its settings document's ``dispatch_num``, ``max_retry_times``, ``prior`` and ``revisit``}."""
    return {s["job"]: s for s in CrawlerDownloadSetting._get_collection().find(
        {"job": {"$in": job_ids}},
        {"job": 1, "dispatch_num": 1, "max_retry_times": 1, "prior": 1, "revisit": 1})}


def context(job_id) -> dict | None:
    """What a worker needs of a job (None if it is gone): ``name``; ``status`` (OFF when its
    downloader is); ``download_id`` and ``code`` of its downloader; ``language`` of its type
    ("none": the built-in engine) and whether that type is ``supported``; ``settings``, its
    settings document (``{}`` if none); ``follow``, its ``[follow]`` table (None if none)."""
    job = Job._get_collection().find_one({"_id": job_id}, {"name": 1, "status": 1, "follow": 1})
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
            "language": language, "supported": supported, "settings": conf, "follow": job.get("follow")}
