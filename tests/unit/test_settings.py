"""Settings: environment over a local file over the defaults, typed; the job settings model mirrors
the one declaration of job settings."""
from __future__ import annotations

from pathlib import Path

import pytest

from common.config import Settings
from common.errors import ConfigError


def test_env_overrides_are_typed_and_local_file_is_below_env(tmp_path: Path):
    local = tmp_path / "local.py"
    local.write_text("Q_DOWN_LOW_LEN = 7\nDISPATCH_ORDER = 'host'\n")
    s = Settings(environ={"DOWNCLUSTER_SETTINGS": str(local), "DOWNCLUSTER_Q_DOWN_LOW_LEN": "50",
                          "DOWNCLUSTER_RETRY_BACKOFF_BASE": "0.5"})
    assert s.Q_DOWN_LOW_LEN == 50 and s.DISPATCH_ORDER == "host" and s.RETRY_BACKOFF_BASE == 0.5
    flagged = Settings(environ={"DOWNCLUSTER_Q_DOWN_LOW_LEN": "50"}, flags={"Q_DOWN_LOW_LEN": 3})
    assert flagged.Q_DOWN_LOW_LEN == 3  # a command-line flag is above the environment
    with pytest.raises(AttributeError, match="read-only"):
        flagged.Q_DOWN_LOW_LEN = 4  # resolved once, then frozen
    with pytest.raises(ConfigError, match="DOWNCLUSTER_Q_DOWN_LOW_LEN"):
        Settings(environ={"DOWNCLUSTER_Q_DOWN_LOW_LEN": "many"})


def test_the_job_settings_model_mirrors_the_one_declaration():
    from mongoengine import BooleanField, DictField, FloatField, IntField, StringField

    from common.jobsettings import SETTINGS
    from common.store.models import CrawlerDownloadSetting

    kinds = {int: IntField, float: FloatField, bool: BooleanField, str: StringField, dict: DictField}
    fields = CrawlerDownloadSetting._fields
    declared = {s.name for s in SETTINGS}
    assert declared <= set(fields)
    # private_grant: not a manifest's setting but who granted allow_private (written by registration)
    assert set(fields) - declared == {"id", "job", "add_datetime", "last_update_datetime", "private_grant"}
    for s in SETTINGS:
        field = fields[s.name]
        assert isinstance(field, kinds[s.value_type]), s.name
        if s.value_type in (int, float):
            assert (field.min_value, field.max_value) == (s.low, s.high), s.name


def test_a_job_s_settings_are_resolved_from_the_one_declaration():
    """Dispatcher, worker and registration read a job's settings through ``resolved``: what a
    document lacks or leaves unset is the declaration's default (a cluster setting's, read now)."""
    from common.jobsettings import ENGINES, resolved

    cluster = Settings(environ={"DOWNCLUSTER_DEFAULT_DISPATCH_NUM": "17"})
    got = resolved({"job": 1, "_id": 2, "max_retry_times": 0, "download_engine": "", "obey_robots": False,
                    "host_delay": None}, cluster)
    assert got["dispatch_num"] == 17 and got["max_retry_times"] == 0 and got["obey_robots"] is False
    assert got["download_engine"] == ENGINES[0] and got["host_delay"] == 0.0 and got["headers"] == {}
    assert "job" not in got and "_id" not in got and got["prior"] == 0 and got["data_retention_days"] is None


def test_a_setting_flag_is_above_the_environment_and_settings_are_read_only(monkeypatch):
    from click.testing import CliRunner

    from common.cli import main
    from common.config import load, settings

    monkeypatch.setenv("DOWNCLUSTER_WEB_BIND", "127.0.0.1:1")
    try:
        assert load().WEB_BIND == "127.0.0.1:1"
        result = CliRunner().invoke(main, ["web", "--bind", "nonsense"])
        assert result.exit_code == 2 and "got 'nonsense'" in result.output
        assert settings.WEB_BIND == "nonsense" and dict(settings.flags) == {"WEB_BIND": "nonsense"}
        with pytest.raises(AttributeError, match="read-only"):
            settings.WEB_BIND = "127.0.0.1:2"
    finally:
        monkeypatch.undo()
        load()
