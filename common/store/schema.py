"""Every document class of the three databases: what ``connect_mongo(ensure_indexes=True)`` makes
the indexes of, and what docs/schema.md lists (a test holds them equal)."""
from __future__ import annotations

from common.store.control_models import (
    ApiToken,
    AuditEntry,
    CenterCaller,
    CenterKey,
    ClusterSecret,
    Project,
    WebSession,
)
from common.store.log_models import (
    CrawlerDispatchAlertLog,
    CrawlerDispatchLog,
    CrawlerDownloadLog,
    CrawlerGeneratorLog,
    CrawlerRegistrationErrorLog,
    NotificationLog,
)
from common.store.models import (
    CrawlerDownload,
    CrawlerDownloadData,
    CrawlerDownloadSetting,
    CrawlerDownloadType,
    CrawlerGenerator,
    CrawlerLease,
    CrawlerOldVersion,
    CrawlerTask,
    CrawlerTaskCount,
    CrawlerTaskKey,
    DefenderState,
    Export,
    Job,
    LostLease,
    Notification,
)

ALL_MODELS = (
    Project,
    AuditEntry,
    Export,
    Notification,
    NotificationLog,
    ClusterSecret,
    ApiToken,
    WebSession,
    CenterCaller,
    CenterKey,
    Job,
    CrawlerDownloadType,
    CrawlerDownload,
    CrawlerDownloadSetting,
    CrawlerTask,
    CrawlerTaskKey,
    CrawlerTaskCount,
    CrawlerLease,
    LostLease,
    DefenderState,
    CrawlerDownloadData,
    CrawlerDownloadLog,
    CrawlerDispatchAlertLog,
    CrawlerDispatchLog,
    CrawlerRegistrationErrorLog,
    CrawlerGenerator,
    CrawlerGeneratorLog,
    CrawlerOldVersion,
)
