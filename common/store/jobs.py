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

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from bson import ObjectId

from common.errors import NotFound, ValidationError
from common.store.clock import utcnow
from common.store.log_models import CrawlerRegistrationErrorLog
from common.store.models import OFF, ON, CrawlerDownload, CrawlerDownloadSetting, CrawlerDownloadType
from common.store.models import Job as JobDoc
from common.store.records import DownloadType, Job, JobSettings

UNSET = JobSettings.from_doc({})  # the settings of a job without a settings document: every default


def named(name: object) -> Job:
    """The job called ``name`` (a plain string, looked up as a literal), or NotFound."""
    if not isinstance(name, str):
        raise ValidationError("job must be a string")
    job = JobDoc._get_collection().find_one({"name": name})
    if job is None:
        raise NotFound(f"no job named {name!r}")
    return Job.from_doc(job)


def find(name: str) -> Job | None:
    """The job called ``name``, or None."""
    return Job.maybe(JobDoc._get_collection().find_one({"name": name}))


def ordered() -> list[Job]:
    """Every job, by priority then name."""
    return [Job.from_doc(d) for d in JobDoc._get_collection().find({}).sort([("priority", 1), ("name", 1)])]


def names() -> dict[ObjectId, str]:
    """Every job's name by its id."""
    return {j["_id"]: j["name"] for j in JobDoc._get_collection().find({}, {"name": 1})}


def name_of(job_id: ObjectId) -> str:
    """The name of job ``job_id`` (its id as text if it is gone)."""
    job = JobDoc._get_collection().find_one({"_id": job_id}, {"name": 1})
    return str(job["name"]) if job else str(job_id)


def exists(job_id: ObjectId) -> bool:
    return JobDoc._get_collection().find_one({"_id": job_id}, {"_id": 1}) is not None


def set_status(job: Job, status: str) -> Job:
    """Turn a job ON or OFF; the job as stored after."""
    coll = JobDoc._get_collection()
    coll.update_one({"_id": job.id}, {"$set": {"status": status, "last_update_datetime": utcnow()}})
    return Job.from_doc(coll.find_one({"_id": job.id}))


# --- registration ------------------------------------------------------------------------

def ensure_types(languages: list[str] | tuple[str, ...]) -> None:
    """Create the supported downloader type rows of ``languages`` the first time they are needed."""
    for language in languages:
        CrawlerDownloadType.objects(language=language).update_one(
            set_on_insert__is_support="support", set_on_insert__add_datetime=utcnow(), upsert=True
        )


def download_type(language: str) -> DownloadType:
    """The downloader type ``language`` (KeyError if the cluster has none of that name)."""
    found = DownloadType.maybe(CrawlerDownloadType._get_collection().find_one({"language": language}))
    if found is None:
        raise KeyError(language)
    return found


def store(name: str, priority: int, worker_host: str, code: str, dtype: DownloadType, fields: dict[str, Any],
          project: int | None = None, follow: dict[str, Any] | None = None,
          sitemaps: dict[str, Any] | None = None) -> tuple[Job, bool]:
    """Create or update job ``name`` (in ``project``, if given), its download (``code`` of type
    ``dtype``), its settings (``fields``), what it follows (``follow``, the checked ``[follow]``
    table; None: nothing) and its sitemaps (``sitemaps``, the checked ``[sitemaps]``); (job, created)."""
    now = utcnow()
    doc = JobDoc.objects(name=name).first()
    created = doc is None
    doc = doc or JobDoc(name=name, add_datetime=now)
    doc.priority, doc.worker_host, doc.follow, doc.last_update_datetime = priority, worker_host, follow, now
    doc.sitemaps = sitemaps
    if project is not None:
        doc.project = project
    doc.save()
    download = CrawlerDownload.objects(job=doc).first() or CrawlerDownload(job=doc, add_datetime=now)
    download.code, download.status, download.last_update_datetime = code, ON, now
    download.types = CrawlerDownloadType.objects.get(id=dtype.id)
    download.save()
    setting = CrawlerDownloadSetting.objects(job=doc).first()
    setting = setting or CrawlerDownloadSetting(job=doc, add_datetime=now)
    for key, value in fields.items():
        setattr(setting, key, value)
    setting.last_update_datetime = now
    setting.save()
    return Job.from_doc(doc.to_mongo()), created


def log_rejected(name: str, manifest: str, reason: str, hostname: str, project: int | None = None,
                 actor: str | None = None) -> None:
    CrawlerRegistrationErrorLog(name=name, manifest=manifest, reason=reason, hostname=hostname,
                                project=project, actor=actor).save()


def type_rows() -> list[tuple[DownloadType, int]]:
    """Every downloader type and how many jobs use it, by language."""
    used: dict[ObjectId, int] = {}
    for row in CrawlerDownload._get_collection().aggregate([{"$group": {"_id": "$types", "n": {"$sum": 1}}}]):
        used[row["_id"]] = row["n"]
    found = CrawlerDownloadType._get_collection().find({}).sort("language", 1)
    return [(t, used.get(t.id, 0)) for t in map(DownloadType.from_doc, found)]


def set_support(language: str, supported: bool) -> None:
    support = "support" if supported else "unsupport"
    CrawlerDownloadType.objects(language=language).update_one(set__is_support=support)


def type_names() -> dict[ObjectId, str]:
    """Each job's downloader language by job id."""
    kinds = {d["job"]: d["types"] for d in CrawlerDownload._get_collection().find({}, {"job": 1, "types": 1})}
    types = CrawlerDownloadType._get_collection().find({}, {"language": 1})
    languages = {t["_id"]: t["language"] for t in types}
    return {job_id: languages.get(kind, "?") for job_id, kind in kinds.items()}


def settings_of(job: Job) -> JobSettings | None:
    return JobSettings.maybe(CrawlerDownloadSetting._get_collection().find_one({"job": job.id}))


def code_chars(job: Job) -> int:
    """How long the job's code is (0 if it has no download)."""
    d = CrawlerDownload._get_collection().find_one({"job": job.id}, {"code": 1})
    return len(d.get("code") or "") if d else 0


# --- report mails ------------------------------------------------------------------------

def reported() -> list[tuple[Job, str]]:
    """(job, report_mails) of every job with report mails: the job's name and report fields."""
    out = []
    for s in CrawlerDownloadSetting._get_collection().find({"report_mails": {"$nin": ["", None]}},
                                                            {"job": 1, "report_mails": 1}):
        job = JobDoc._get_collection().find_one({"_id": s["job"]},
                                                {"name": 1, "report_counts": 1, "alert_mail_at": 1})
        if job is not None:
            out.append((Job.from_doc(job), s["report_mails"]))
    return out


def claim_summary(job: Job, counts: dict[str, int], now: datetime) -> bool:
    """Record ``counts`` as the job's reported summary unless another run did first; whether this one did."""
    done = JobDoc._get_collection().update_one({"_id": job.id, "report_counts": job.report_counts},
                                               {"$set": {"report_counts": counts, "report_at": now}})
    return bool(done.modified_count)


def claim_alert(job: Job, last: datetime | None, now: datetime) -> bool:
    """Record an alert mail at ``now`` unless another run did since ``last``; whether this one did."""
    return bool(JobDoc._get_collection().update_one({"_id": job.id, "alert_mail_at": last},
                                                    {"$set": {"alert_mail_at": now}}).modified_count)


# --- what the dispatcher and the workers read (one read per collection named, whatever the
# number of tasks) ---

def on_jobs() -> list[Job]:
    """The ON jobs, each with ``name``, ``priority``, ``host`` and its cursor fields (``seq_sent``,
    ``seq_next``, ``intake``, ``revisit_from``, ``revisit_from_id``: ``common.store.tasks``)."""
    fields = {"name": 1, "priority": 1, "host": 1, "seq_sent": 1, "seq_next": 1, "intake": 1,
              "revisit_from": 1, "revisit_from_id": 1}
    return [Job.from_doc(d) for d in JobDoc._get_collection().find({"status": ON}, fields)]


def off_ids() -> list[ObjectId]:
    """The ids of the jobs that are OFF."""
    return [j["_id"] for j in JobDoc._get_collection().find({"status": OFF}, {"_id": 1})]


def dispatch_settings(job_ids: list[ObjectId]) -> dict[ObjectId, JobSettings]:
    """{job id: its settings' ``dispatch_num``, ``max_retry_times``, ``prior`` and ``revisit``}."""
    return {s["job"]: JobSettings.from_doc(s) for s in CrawlerDownloadSetting._get_collection().find(
        {"job": {"$in": job_ids}},
        {"job": 1, "dispatch_num": 1, "max_retry_times": 1, "prior": 1, "revisit": 1})}


@dataclass(frozen=True, slots=True)
class WorkerJob:
    """What a worker needs of a job: ``status`` is OFF when its downloader is; ``language`` is
    its downloader type's ("none": the built-in engine) and ``supported`` whether that type is."""

    name: str
    status: str
    download_id: ObjectId | None
    code: str
    language: str
    supported: bool
    settings: JobSettings
    follow: dict[str, Any] | None = None  # the checked [follow] table (None: follows nothing)
    sitemaps: dict[str, Any] | None = None  # the checked [sitemaps] table (None: no sitemap)
    project: int | None = None  # its project (None: stored before projects, ``default``'s)


def context(job_id: ObjectId) -> WorkerJob | None:
    """What a worker needs of a job (None if it is gone)."""
    fields = {"name": 1, "status": 1, "follow": 1, "sitemaps": 1, "project": 1}
    job = JobDoc._get_collection().find_one({"_id": job_id}, fields)
    if job is None:
        return None
    download = CrawlerDownload._get_collection().find_one({"job": job_id})
    conf = JobSettings.maybe(CrawlerDownloadSetting._get_collection().find_one({"job": job_id})) or UNSET
    if conf.allow_private and not conf.private_grant:  # asked for, never granted: no private reach
        conf = replace(conf, allow_private=False)
    language, supported = "none", True
    if download is not None and download.get("types"):
        t = CrawlerDownloadType._get_collection().find_one({"_id": download["types"]},
                                                           {"language": 1, "is_support": 1})
        kind = DownloadType.maybe(t)
        language = kind.language if kind else "none"
        supported = kind is None or kind.is_support == "support"
    off = download is not None and download.get("status") == OFF
    return WorkerJob(name=job["name"], status=OFF if off else job.get("status", OFF),
                     download_id=download["_id"] if download else None,
                     code=(download or {}).get("code", ""), language=language, supported=supported,
                     settings=conf, follow=job.get("follow"), sitemaps=job.get("sitemaps"),
                     project=job.get("project"))


def settle_private_grants(open_projects: set[int], default_project: int) -> list[str]:
    """Jobs stored asking for ``allow_private`` before it needed a grant: those of a project an
    admin opened to private addresses are granted by it; the others lose it. The names of those.
    Safe to repeat."""
    coll = CrawlerDownloadSetting._get_collection()
    ungranted = {"allow_private": True, "private_grant": {"$in": [None, ""]}}
    asked = {d["job"]: d["_id"] for d in coll.find(ungranted, {"job": 1})}
    if not asked:
        return []
    lost: list[str] = []
    for doc in JobDoc._get_collection().find({"_id": {"$in": list(asked)}}, {"name": 1, "project": 1}):
        granted = (doc.get("project") or default_project) in open_projects
        change = {"private_grant": "project"} if granted else {"allow_private": False}
        coll.update_one({"_id": asked[doc["_id"]]}, {"$set": change})
        if not granted:
            lost.append(doc["name"])
    return sorted(lost)

