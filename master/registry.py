"""Job registration: validate a TOML manifest and its downloader code, then store the job.

Everything is checked before anything is written; an invalid manifest stores nothing but
a ``CrawlerRegistrationErrorLog`` record and raises ``ValidationError`` with one line.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from common import intake, jobsettings
from common.config import settings
from common.cron import check_schedule
from common.engines import BUILTIN, DOWNLOADER_TYPES, traits
from common.errors import Forbidden, NotFound, ValidationError, too_many_digits
from common.jobsettings import ENGINES
from common.notify import check_mail
from common.queue.names import DEFAULT_PRIORITY, PRIORITIES
from common.secrets import mask_proxy
from common.store import due, generators, jobs, projects
from common.store.clock import utcnow
from common.store.models import OFF, ON
from common.store.records import DownloadType, Job

if TYPE_CHECKING:
    from common.store.control import Token

MAX_CODE_BYTES = 1024 * 1024
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
TOP_KEYS = {"name", "priority", "host", "type", "code", "settings", "generator", "follow", "sitemaps"}
GENERATOR_KEYS = {"type", "code", "source", "schedule", "schemes"}
SCHEME_RE = re.compile(r"^[a-z][a-z0-9+.-]{0,31}$")
PROJECT_GRANT, ADMIN_GRANT = "project", "admin"  # who let a job reach private addresses


@dataclass
class JobSpec:
    """A validated manifest, ready to store."""

    name: str
    priority: int
    host: str
    type: str
    code: str
    settings: dict[str, Any] = field(default_factory=dict)
    generator: GeneratorSpec | None = None
    follow: jobsettings.Follow | None = None
    sitemaps: jobsettings.Sitemaps | None = None


@dataclass
class GeneratorSpec:
    """A validated ``[generator]`` table."""

    type: str
    code: str
    schedule: str
    schemes: list[str]

    @property
    def digest(self) -> str:
        """What makes a generator a new one (back to test): its type, schedule and code."""
        return hashlib.sha256(json.dumps([self.type, self.schedule, self.code]).encode()).hexdigest()


def validate_settings(raw: Any) -> dict[str, Any]:
    """Each setting's type and range (``common.jobsettings``), then what one setting means for
    another; return the cleaned dict."""
    raw = jobsettings.check(raw)
    proxy = raw.get("proxy", "")
    if proxy:
        try:
            parts = urlsplit(proxy)
            _ = parts.port  # raises ValueError on a port that is not a number
        except ValueError:
            raise ValidationError("settings.proxy is not a valid URL") from None
        if parts.scheme not in ("http", "https", "socks5", "socks5h") or not parts.hostname:
            raise ValidationError("settings.proxy must be a http://, https:// or socks5:// URL with a host")
    engine = jobsettings.resolved(raw, settings)["download_engine"]
    if engine not in ENGINES:
        raise ValidationError(f"settings.download_engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if "download_js" in raw:  # a function body run in the page by the browser engine (never here)
        if not raw["download_js"].strip():
            raise ValidationError("settings.download_js is empty: leave it out, or give a function body")
        if not traits(BUILTIN, engine).needs_browser:
            raise ValidationError('settings.download_js needs download_engine = "browser"')
    revisit, ceiling = raw.get("revisit", 0), raw.get("revisit_max", 0)
    if 0 < revisit < 1:
        raise ValidationError("settings.revisit must be 0 (never) or at least 1 second")
    if ceiling and not revisit:
        raise ValidationError("settings.revisit_max needs settings.revisit (the shortest interval)")
    if ceiling and ceiling < revisit:
        raise ValidationError("settings.revisit_max must be at least settings.revisit")
    for mail in filter(None, (m.strip() for m in raw.get("report_mails", "").split(","))):
        try:
            check_mail(mail)
        except ValidationError as exc:
            raise ValidationError(f"settings.report_mails: {exc}") from None
    return raw


def check_python(code: str) -> None:
    """Parse (never run) python downloader code; it must define a top-level ``download(task)``."""
    try:
        tree = ast.parse(code, filename="<downloader>")
    except SyntaxError as exc:
        raise ValidationError(f"python code does not parse: {exc.msg} (line {exc.lineno})") from None
    except ValueError as exc:  # e.g. null bytes
        raise ValidationError(f"python code does not parse: {exc}") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "download":
            args = node.args
            if len(args.posonlyargs) + len(args.args) >= 1 or args.vararg:
                return
            raise ValidationError("python code: download() must take the task as its argument")
    raise ValidationError("python code defines no top-level function download(task)")


def check_generator_python(code: str) -> None:
    """Parse (never run) python generator code; it must define a top-level ``generate()``."""
    try:
        tree = ast.parse(code, filename="<generator>")
    except SyntaxError as exc:
        raise ValidationError(
            f"generator python code does not parse: {exc.msg} (line {exc.lineno})") from None
    except ValueError as exc:
        raise ValidationError(f"generator python code does not parse: {exc}") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "generate":
            args = node.args
            required = len(args.posonlyargs) + len(args.args) - len(args.defaults)
            if required or any(d is None for d in args.kw_defaults):
                raise ValidationError("generator python code: generate() must take no arguments")
            return
    raise ValidationError("generator python code defines no top-level function generate()")


def _text(data: bytes, label: str) -> str:
    """Code read from a file: at most MAX_CODE_BYTES of UTF-8 (else a one-line ValidationError)."""
    if len(data) > MAX_CODE_BYTES:
        raise ValidationError(f"{label} is larger than {MAX_CODE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValidationError(f"{label} is not UTF-8") from None


def _table(raw: Any, keys: set, not_a_table: str, what: str) -> None:
    """``raw`` is a table of known ``keys`` only (else a one-line ValidationError)."""
    if not isinstance(raw, dict):
        raise ValidationError(not_a_table)
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise ValidationError(f"unknown {what} {unknown[0]!r}")


def validate_generator(raw: Any, base_dir: Path | None) -> GeneratorSpec | None:
    """The ``[generator]`` table: ``type`` python or shell; its code as ``code`` (a file beside the
    manifest) or ``source`` (the code itself; the only form over the API); ``schedule`` (cron or
    ``@every N[s|m|h]``); ``schemes`` the URL schemes it may emit (default http, https)."""
    if raw is None:
        return None
    _table(raw, GENERATOR_KEYS, "generator must be a table", "generator key")
    kind = raw.get("type")
    if kind not in ("python", "shell"):
        raise ValidationError(f"generator.type must be python or shell, got {kind!r}")
    if ("code" in raw) == ("source" in raw):
        raise ValidationError("generator needs exactly one of code = \"path/to/file\" or source = \"...\"")
    if "source" in raw:
        if not isinstance(raw["source"], str):
            raise ValidationError("generator.source must be a string")
        label, data = "generator.source", raw["source"].encode("utf-8", "surrogatepass")
    else:
        rel = raw["code"]
        if base_dir is None:
            raise ValidationError(
                "generator: give the code itself as source = \"...\" (no files over the API)")
        if not isinstance(rel, str) or not rel:
            raise ValidationError("generator.code must be a path to the generator's file")
        try:
            data = (base_dir / rel).read_bytes()
        except OSError as exc:
            raise ValidationError(f"cannot read generator code file {rel}: {exc.strerror}") from None
        label = f"generator code file {rel}"
    code = _text(data, label)
    if "\0" in code:
        raise ValidationError(f"{label} contains a NUL byte")
    if kind == "python":
        check_generator_python(code)
    elif not code.strip():
        raise ValidationError(f"{label} is empty")
    schedule = check_schedule(raw.get("schedule"))
    schemes = raw.get("schemes", ["http", "https"])
    if not isinstance(schemes, list) or not schemes or not all(
            isinstance(s, str) and SCHEME_RE.match(s) for s in schemes):
        raise ValidationError("generator.schemes must be a non-empty list of URL schemes such as \"https\"")
    bad = sorted(set(schemes) - {"http", "https"})
    if bad:  # intake accepts no other scheme: allowing one would change nothing (invariant 6)
        raise ValidationError(f"generator.schemes: the cluster downloads http and https only, not {bad[0]!r}")
    return GeneratorSpec(type=kind, code=code, schedule=schedule, schemes=sorted(set(schemes)))


def validate_manifest(data: Any, base_dir: Path | None, inline_code: str | None = None) -> JobSpec:
    """Validate a parsed manifest and its code: the file it names under ``base_dir``, or
    ``inline_code`` (the API sends the code with the manifest)."""
    _table(data, TOP_KEYS, "manifest must be a TOML table", "manifest key")
    name, priority, host, language = _head(data)
    cleaned = validate_settings(data.get("settings"))
    code = _downloader_code(data, language, base_dir, inline_code)
    generator = validate_generator(data.get("generator"), base_dir)
    follow = jobsettings.check_follow(data.get("follow"))
    if follow is not None and not traits(language).gives_links:
        raise ValidationError("follow needs type none (built-in engines) or python (it returns its links)")
    sitemaps = jobsettings.check_sitemaps(data.get("sitemaps"))
    if sitemaps is not None and sitemaps.lastmod and not cleaned.get("revisit"):
        raise ValidationError("sitemaps.lastmod feeds revisits: it needs settings.revisit")
    return JobSpec(name=name, priority=priority, host=host, type=language, code=code, settings=cleaned,
                   generator=generator, follow=follow, sitemaps=sitemaps)


def _head(data: dict) -> tuple[str, int, str, str]:
    """The manifest's ``name``, ``priority``, ``host`` and downloader ``type``, checked in that order."""
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValidationError(f"name must be 1-128 letters, digits, '_', '.' or '-', got {name!r}")
    priority = data.get("priority", DEFAULT_PRIORITY)
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in PRIORITIES:
        raise ValidationError(f"priority must be an integer in -1..5, got {priority!r}")
    host = data.get("host", "")
    if not isinstance(host, str) or not re.match(r"^[A-Za-z0-9_.-]{0,128}$", host):
        raise ValidationError(f"host must be a host name, got {host!r}")
    language = data.get("type", "none")
    if language not in DOWNLOADER_TYPES:
        raise ValidationError(f"type must be one of {', '.join(DOWNLOADER_TYPES)}, got {language!r}")
    return name, priority, host, language


def _downloader_code(data: dict, language: str, base_dir: Path | None, inline_code: str | None) -> str:
    """The downloader's code, checked ("" for type none, which takes none)."""
    if traits(language).builtin:
        if data.get("code") or inline_code:
            raise ValidationError("type none uses the built-in engine and takes no code")
        return ""
    rel, raw = _code_bytes(data.get("code"), language, base_dir, inline_code)
    code = _text(raw, f"code file {rel}")
    if language == "python":
        check_python(code)
    elif not code.strip():
        raise ValidationError(f"shell code file {rel} is empty")
    return code


def _code_bytes(rel: Any, language: str, base_dir: Path | None,
                inline_code: str | None) -> tuple[str, bytes]:
    """(label, bytes) of the code: ``inline_code`` over the API, else the file ``rel`` under ``base_dir``."""
    if base_dir is None:
        if not isinstance(inline_code, str) or not inline_code:
            raise ValidationError(f"type {language} needs its code")
        return "(code)", inline_code.encode("utf-8", "surrogatepass")
    if not isinstance(rel, str) or not rel:
        raise ValidationError(f"type {language} needs code = \"path/to/file\"")
    try:
        return rel, (base_dir / rel).read_bytes()
    except OSError as exc:
        raise ValidationError(f"cannot read code file {rel}: {exc.strerror}") from None


def parse_manifest(text: str, label: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(f"manifest {label} is not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per level of arrays and inline tables
        raise ValidationError(f"manifest {label} nests arrays or tables too deeply") from None
    except ValueError:  # an integer past Python's digit limit
        raise too_many_digits(f"manifest {label}") from None


def load_manifest(path: str | Path) -> JobSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"cannot read manifest {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValidationError(f"manifest {path} is not UTF-8") from None
    return validate_manifest(parse_manifest(text, str(path)), path.parent)


def ensure_download_types() -> None:
    """Create the supported CrawlerDownloadType rows the first time they are needed."""
    jobs.ensure_types(DOWNLOADER_TYPES)


def store(spec: JobSpec, project: int | None = None, token: Token | None = None) -> tuple[Job, bool]:
    """Create or update the job, its downloader and its settings; (job, created). Private reach is
    the administrator's grant (``private_grant``)."""
    ensure_download_types()
    dtype = jobs.download_type(spec.type)
    if dtype.is_support != "support":
        raise ValidationError(f"downloader type {spec.type} is not supported on this cluster")
    fields = jobsettings.resolved(_stored_proxy(spec.name, spec.settings), settings)
    fields["private_grant"] = private_grant(bool(fields.get("allow_private")), project, token)
    follow = None if spec.follow is None else {k: list(v) if isinstance(v, tuple) else v
                                               for k, v in asdict(spec.follow).items()}
    sitemaps = None if spec.sitemaps is None else {k: list(v) if isinstance(v, tuple) else v
                                                   for k, v in asdict(spec.sitemaps).items()}
    job, created = jobs.store(spec.name, spec.priority, spec.host, spec.code, dtype, fields, project, follow,
                              sitemaps)
    if spec.sitemaps is not None and spec.sitemaps.urls:  # a worker reads them (never the master)
        intake.add_sitemaps(job.id, spec.sitemaps.urls)
    if fields.get("revisit"):  # its stored pages come due again: the "revisits" chore's work
        due.start_revisits(job.id, utcnow())
    g = spec.generator
    if g is None:
        generators.remove(job.id)
    else:
        generators.store(job.id, g.type, g.code, g.schedule, g.schemes, g.digest, utcnow())
    return job, created


def _stored_proxy(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` with its proxy replaced by the job's stored one when it is that proxy as the API
    shows it (password masked): a change that hands back what it was shown keeps the proxy."""
    proxy = given.get("proxy") or ""
    job = jobs.find(name) if "***" in proxy else None
    stored = jobs.settings_of(job) if job is not None else None
    if stored is not None and stored.proxy and mask_proxy(stored.proxy) == proxy:
        return {**given, "proxy": stored.proxy}
    return given


def private_grant(wanted: bool, project: int | None, token: Token | None) -> str:
    """Who grants a job's ``allow_private``: ``project`` (an admin opened its project to private
    addresses), ``admin`` (an admin registered it), or "" (not asked for). Anyone else asking is
    refused: reach is granted, never taken."""
    from master import access

    if not wanted:
        return ""
    found = projects.by_id(project) if project is not None else None
    if found is not None and found.allow_private:
        return PROJECT_GRANT
    if access.is_admin(token):
        return ADMIN_GRANT
    raise Forbidden("allow_private needs an administrator's grant: a project created with "
                    "--allow-private, or an admin registering the job")


def register(path: str | Path, token: Token | None = None, project: int | None = None) -> Job:
    """Validate and store the manifest at ``path``; on rejection log it and re-raise. The job goes
    to ``project`` (see ``master.access.project_for_new_job``); a job that exists keeps its own."""
    def guess() -> str:
        try:
            return guess_name(Path(path).read_text("utf-8"))
        except (OSError, UnicodeDecodeError):
            return ""
    return _logged(lambda: load_manifest(path), str(path), guess, token, project)[0]


def register_text(manifest: str, code: str | None = None, token: Token | None = None,
                  project: int | None = None) -> tuple[Job, bool]:
    """Validate and store a manifest given as text, with its code (the API's door); (job, created)."""
    def load() -> JobSpec:
        if not isinstance(manifest, str) or "\0" in manifest or len(manifest) > MAX_CODE_BYTES:
            raise ValidationError("manifest must be TOML text of at most 1 MiB")
        return validate_manifest(parse_manifest(manifest, "(text)"), None, code)
    return _logged(load, "(api)", lambda: guess_name(manifest), token, project)


def _logged(load, label: str, guess, token: Token | None, project: int | None) -> tuple[Job, bool]:
    actor = token.name if token is not None else "cli"
    try:
        spec = load()
    except ValidationError as exc:  # logged in the submitter's project, whatever name it gave
        jobs.log_rejected(guess(), label, str(exc), settings.HOSTNAME, _submitted_to(token, project), actor)
        raise
    # who may: not a rejection of the manifest, so not logged where readers of the job would see it
    project_id = _project(spec.name, token, project)
    try:
        return store(spec, project_id, token)
    except ValidationError as exc:
        jobs.log_rejected(spec.name, label, str(exc), settings.HOSTNAME, project_id, actor)
        raise


def _submitted_to(token: Token | None, wanted: int | None) -> int | None:
    """The project a rejected manifest was meant for, as far as the caller may name one (None:
    only admins see the rejection)."""
    from master import access

    try:
        return access.project_for_new_job(token, wanted)
    except (NotFound, Forbidden):
        return None


def _project(name: str, token: Token | None, wanted: int | None) -> int:
    """The project of job ``name`` once stored: an existing job's own (only an admin moves it to
    ``wanted``), a new one's as ``access.project_for_new_job`` says."""
    from master import access

    existing = jobs.find(name)
    if existing is None:
        return access.project_for_new_job(token, wanted)
    access.job(name, token, change=True)
    if wanted is not None:
        access.check_project(token, wanted)
    current = access.project_of(existing)
    if wanted is None or wanted == current:
        return current
    if not access.is_admin(token):
        raise Forbidden("only an admin moves a job to another project")
    return access.project_for_new_job(token, wanted)


def guess_name(text: str) -> str:
    try:
        return str(tomllib.loads(text).get("name", ""))[:128]
    except Exception:  # the manifest is broken; the log still records where it came from
        return ""


def set_status(name: str, status: str) -> Job:
    if status not in (ON, OFF):
        raise ValidationError(f"status must be ON or OFF, got {status!r}")
    return jobs.set_status(jobs.named(name), status)


# --- downloader types (administrators deploy which languages the platform supports) ---

def type_rows() -> list[tuple[DownloadType, int]]:
    """Every downloader type (whether it is supported) and how many jobs use it."""
    ensure_download_types()
    return jobs.type_rows()


def set_type_support(language: str, supported: bool) -> tuple[DownloadType, int]:
    """Allow or refuse a downloader language: registration refuses jobs of an unsupported one and
    workers fail their tasks with that reason (within CONTEXT_TTL seconds)."""
    ensure_download_types()
    if language not in DOWNLOADER_TYPES:
        raise NotFound(f"no downloader type {str(language)[:40]!r} (one of {', '.join(DOWNLOADER_TYPES)})")
    jobs.set_support(language, supported)
    return next(r for r in type_rows() if r[0].language == language)
