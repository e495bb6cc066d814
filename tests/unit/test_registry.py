"""A job's manifest, settings and python downloader checked before it is registered (never run)."""
from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ValidationError
from master.registry import check_python, validate_manifest, validate_settings


@pytest.mark.parametrize(
    "code,why",
    [
        ("def download(:\n", "does not parse"),
        ("x = 1\n", "no top-level"),
        ("def download():\n  pass\n", "argument"),
        ("class A:\n  def download(self, t): pass\n", "no top-level"),
    ],
)
def test_python_code_checked_without_running(code, why):
    with pytest.raises(ValidationError, match=why):
        check_python(code)
    check_python("import os\nos._exit(1)\ndef download(task):\n    return {}\n")  # parsed, never run


@pytest.mark.parametrize(
    "settings_,why",
    [
        ({"dispatch_num": 0}, "dispatch_num"),
        ({"dispatch_num": "10"}, "dispatch_num"),
        ({"max_retry_times": -1}, "max_retry_times"),
        ({"proxy": "not a url"}, "proxy"),
        ({"proxy": "ftp://h:1"}, "proxy"),
        ({"prior": 3}, "prior"),
        ({"download_engine": "curl"}, "download_engine"),
        ({"report_mails": "nobody"}, "report_mails"),
        ({"bogus": 1}, "unknown"),
        ({"cookie": "a\nb"}, "cookie"),
        ({"headers": {"X": 1}}, "headers"),
    ],
)
def test_bad_settings_rejected(settings_, why):
    with pytest.raises(ValidationError, match=why):
        validate_settings(settings_)


def test_manifest_validation(tmp_path: Path):
    (tmp_path / "d.py").write_text("def download(task):\n    return {}\n")
    (tmp_path / "empty.sh").write_text("  \n")
    spec = validate_manifest({"name": "n", "priority": -1, "type": "python", "code": "d.py",
                              "settings": {"proxy": "http://u:p@proxy:3128"}}, tmp_path)
    assert spec.priority == -1 and "download" in spec.code
    for data, why in [
        ({"name": "bad name!"}, "name"),
        ({"name": "n", "priority": True}, "priority"),
        ({"name": "n", "type": "java"}, "type"),
        ({"name": "n", "type": "shell", "code": "empty.sh"}, "empty"),
        ({"name": "n", "type": "python", "code": "missing.py"}, "cannot read"),
        ({"name": "n", "type": "python"}, "needs code"),
        ({"name": "n", "extra": 1}, "unknown"),
    ]:
        with pytest.raises(ValidationError, match=why):
            validate_manifest(data, tmp_path)
