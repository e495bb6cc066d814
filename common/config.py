"""The cluster's settings: resolved once per process, then read-only.

Precedence, lowest to highest: ``settings.py`` (the one declaration of every cluster setting
and its default) < the local file named by ``DOWNCLUSTER_SETTINGS`` < the environment variable
``DOWNCLUSTER_<NAME>`` < command-line flags. Environment values are converted to the type of
the default, so ``DOWNCLUSTER_Q_DOWN_LOW_LEN=50`` is the integer 50.

A process resolves them once: at the first read of a setting from its environment, or, when the
``downcluster`` command was given a flag that sets one (``worker --host``, ``web --bind``), by
``load`` with those flags before anything reads them. Forked children (rq's work-horses) inherit
them; spawned ones (uvicorn's workers, a plain ``rq worker``) resolve their own. Assigning a
setting raises; tests call ``load`` to resolve the settings again for a test's environment.
"""
from __future__ import annotations

import os
import runpy
import socket
import threading
from types import MappingProxyType
from typing import Any, Mapping

import settings as defaults
from common.errors import ConfigError

ENV_PREFIX = "DOWNCLUSTER_"
DECLARED = MappingProxyType({k: v for k, v in vars(defaults).items() if k.isupper()})  # settings.py


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


def resolve(environ: Mapping[str, str], flags: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting's effective value, by the precedence above."""
    values = dict(DECLARED)
    local = environ.get(ENV_PREFIX + "SETTINGS")
    if local:
        try:
            found = runpy.run_path(local)
        except OSError as exc:
            raise ConfigError(f"{ENV_PREFIX}SETTINGS: cannot read {local}: {exc.strerror}") from None
        values.update({k: v for k, v in found.items() if k.isupper() and k in values})
    for name, default in DECLARED.items():
        raw = environ.get(ENV_PREFIX + name)
        if raw is not None:
            values[name] = _convert(name, raw, default)
    for name, value in flags.items():
        if name not in values:
            raise ConfigError(f"unknown setting {name}")
        values[name] = value
    values["HOSTNAME"] = values["HOSTNAME"] or socket.gethostname()  # see worker_host
    return values


class Settings:
    """Effective settings as plain read-only attributes (hot paths read settings per page).
    ``flags``: the command-line values they were resolved with."""

    def __init__(self, environ: Mapping[str, str] | None = None,
                 flags: Mapping[str, Any] | None = None) -> None:
        self._install(environ, flags)

    def _install(self, environ: Mapping[str, str] | None, flags: Mapping[str, Any] | None) -> None:
        flags = MappingProxyType(dict(flags or {}))
        values = resolve(os.environ if environ is None else environ, flags)
        # the names are the same at every install, so a concurrent reader sees old or new values
        self.__dict__.update(values, flags=flags)  # flags last: present once every value is

    def __getattr__(self, name: str) -> Any:  # only for names not (yet) set
        if "flags" not in self.__dict__:  # this process's first read, and no load() before it
            with _installing:
                if "flags" not in self.__dict__:
                    self._install(None, None)
            return getattr(self, name)
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"settings are read-only ({name}); they are resolved once, by load()")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"settings are read-only ({name})")


_installing = threading.Lock()
settings = Settings.__new__(Settings)  # this process's settings: resolved by load(), or at the first read


def load(env: Mapping[str, str] | None = None, flags: Mapping[str, Any] | None = None) -> Settings:
    """Resolve the settings from ``env`` (default: this process's environment) and ``flags``
    (setting name to value, above everything else) and install them as ``settings``."""
    with _installing:
        settings._install(env, flags)
    return settings


def add_flags(flags: Mapping[str, Any]) -> Settings:
    """``load`` with ``flags`` above those given before, if any (a test's, when it runs a command
    in its own process); settings not yet resolved are resolved only once, here."""
    return load(flags={**settings.__dict__.get("flags", {}), **flags})


def flag_env() -> dict[str, str]:
    """The command-line flags as DOWNCLUSTER_* variables: for child processes that resolve
    their own settings from their environment."""
    return {ENV_PREFIX + name: str(value) for name, value in settings.flags.items()}


def worker_host() -> str:
    """This worker host's one name (a machine running workers; never a site): in its workers'
    names, its host queues, its leases and its logs.
    HOSTNAME however it was given (settings file, DOWNCLUSTER_HOSTNAME, ``worker --host``); empty
    means the machine's hostname."""
    return settings.HOSTNAME
