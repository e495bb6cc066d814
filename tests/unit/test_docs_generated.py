"""The generated reference documents match what they describe (settings.py, the OpenAPI
description): `python scripts/gendocs.py` rewrites them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_and_api_reference_are_current():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gendocs.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_every_setting_is_documented():
    sys.path.insert(0, str(ROOT / "scripts"))
    import settings
    from gendocs import settings_rows

    rows = {name: doc for _, section in settings_rows((ROOT / "settings.py").read_text())
            for name, _, doc in section}
    names = {name for name in vars(settings) if name.isupper()}
    assert names == set(rows), names ^ set(rows)
    assert not [name for name, doc in rows.items() if not doc.strip()]
