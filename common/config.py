"""Typed access to settings.

Precedence, lowest to highest: ``settings.py`` < the local file named by
``DOWNCLUSTER_SETTINGS`` < the environment variable ``DOWNCLUSTER_<NAME>`` < explicit
overrides (command-line flags). Environment values are converted to the type of the
default, so ``DOWNCLUSTER_Q_DOWN_LOW_LEN=50`` is the integer 50.
"""
from __future__ import annotations

import os
import runpy
import socket
from typing import Any

import settings as defaults

from common.errors import ConfigError

ENV_PREFIX = "DOWNCLUSTER_"


def _convert(name: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if raw.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if raw.strip().lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        raise ConfigError(f"{ENV_PREFIX}{name}: expected {type(default).__name__}, got {raw!r}") from None
    return raw


class Settings:
    """The effective settings; attribute access returns typed values."""

    def __init__(self, environ: dict[str, str] | None = None, **overrides: Any) -> None:
        self._environ = os.environ if environ is None else environ
        self._overrides = overrides
        self.reload()

    def reload(self) -> None:
        values = {k: v for k, v in vars(defaults).items() if k.isupper()}
        local = self._environ.get(ENV_PREFIX + "SETTINGS")
        if local:
            try:
                found = runpy.run_path(local)
            except OSError as exc:
                raise ConfigError(f"{ENV_PREFIX}SETTINGS: cannot read {local}: {exc.strerror}") from None
            values.update({k: v for k, v in found.items() if k.isupper() and k in values})
        for name, default in list(values.items()):
            raw = self._environ.get(ENV_PREFIX + name)
            if raw is not None:
                values[name] = _convert(name, raw, default)
        for name, value in self._overrides.items():
            if name not in values:
                raise ConfigError(f"unknown setting {name}")
            values[name] = value
        values["HOSTNAME"] = values["HOSTNAME"] or socket.gethostname()  # see host_name
        self._values = values
        self.__dict__.update(values)  # plain attributes: hot paths read settings per page

    def override(self, **values: Any) -> None:
        """Apply explicit overrides (highest precedence) and reload."""
        self._overrides.update(values)
        self.reload()

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


settings = Settings()


def host_name() -> str:
    """This host's one name: in its workers' names, its host queues, its leases and its logs.
    HOSTNAME however it was given (settings file, DOWNCLUSTER_HOSTNAME, ``worker --host``); empty
    means the machine's hostname."""
    return settings.HOSTNAME
