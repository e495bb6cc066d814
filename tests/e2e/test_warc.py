"""Issue 42 part 6: WARC 1.1 exports, read back by an outside reader (warcio: ``warcio check``,
``warcio index`` and its ArchiveIterator) and replayed by pywb. Real workers download the sample
site, a revisit brings a 304, an unchanged body and a new version; the file comes from ``data
export --format warc`` and from the export center (a worker writes it, as any export).

pywb pins ``redis==2.10.6`` (ours: 8.1.0), so it cannot live in our venv: ``make test`` builds it
its own under ``var/`` (no test reaches a package index); the replay test is skipped, saying why,
only when that venv could not be built on the machine."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest
import requests

import sample_site
from common.store.log_models import CrawlerDownloadLog
from common.store.models import CrawlerDownloadData, Export, Job
from master.dispatch.dispatcher import dispatch_once
from services import free_port
from tests.e2e.test_revisits import first_visit, keys, task_of, url, visit_again
from tests.helpers import add_urls, burst_worker, cli, register, statuses, wait_for

warcio = pytest.importorskip("warcio")
from warcio.archiveiterator import ArchiveIterator  # noqa: E402

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
PYWB = "pywb==2.10.0"
PYWB_VENV = Path(__file__).resolve().parents[2] / "var" / "pywb-2.10.0"


def record_id(key, kind: str) -> str:
    return f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'downcluster:{key}:{kind}')}>"


def read(path: Path) -> list:
    """Every record of a WARC file: (headers, http status and headers, payload) as warcio reads them."""
    out = []
    with open(path, "rb") as f:
        for rec in ArchiveIterator(f):
            http = None
            if rec.http_headers:
                http = (rec.http_headers.get_statuscode(), dict(rec.http_headers.headers))
            out.append((dict(rec.rec_headers.headers), rec.rec_type, http, rec.content_stream().read()))
    return out


def checked(path: Path) -> None:
    """warcio's own checks: every digest right, and an index of every record."""
    done = subprocess.run([str(BIN / "warcio"), "check", "-v", str(path)], capture_output=True, text=True)
    assert done.returncode == 0 and "digest pass" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert "digest fail" not in done.stdout
    index = subprocess.run([str(BIN / "warcio"), "index", str(path)], capture_output=True, text=True,
                           check=True)
    assert all(json.loads(line)["offset"] for line in index.stdout.splitlines()[1:])


@pytest.fixture
def crawled(cluster, tmp_path):
    """A revisited job: pages answered 304 and with the same body on the second visit, one page
    changed, a binary page and a Shift_JIS one."""
    register(tmp_path, "wa", revisit=1.0)
    pages = keys("etag", "none", "changing")
    others = [f"{cluster.site}/bytes/3000", f"{cluster.site}/shift_jis"]
    add_urls("wa", [url(cluster, k) for k in pages.values()] + others)
    dispatch_once(cluster.redis)
    burst_worker(cluster)
    assert statuses("wa") == {"SUCCESS": 5}
    sample_site.VERSIONED[pages["changing"]][0] = 2
    visit_again(cluster, "wa")
    assert sample_site.ANSWERS[pages["etag"]] == [200, 304]
    assert sample_site.ANSWERS[pages["none"]] == [200, 200]
    return pages


def _assert_archive(path: Path, pages: dict) -> None:
    checked(path)
    records = read(path)
    assert records[0][1] == "warcinfo"
    job = Job.objects.get(name="wa")
    docs = {str(d.id): d for d in CrawlerDownloadData.objects(job=job)}
    assert len(docs) == 6  # 5 pages, and the changed page's second version
    responses = {h["WARC-Record-ID"]: (h, http, body)
                 for h, kind, http, body in records if kind == "response"}
    requests = {h["WARC-Record-ID"]: h for h, kind, _, _ in records if kind == "request"}
    assert len(responses) == len(docs) == len(requests)
    for key, doc in docs.items():
        h, http, body = responses[record_id(key, "response")]
        stored = bytes(doc.response_body)
        assert body == stored  # byte-exact, as stored
        assert h["WARC-Target-URI"] == doc.url and h["WARC-IP-Address"] == "127.0.0.1"
        # the fetch time (when the download started), not the store time
        assert doc.fetched_at is not None and doc.fetched_at <= doc.add_datetime
        assert h["WARC-Date"] == doc.fetched_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert h["WARC-Concurrent-To"] == record_id(key, "request")
        request = requests[record_id(key, "request")]
        assert request["WARC-Concurrent-To"] == record_id(key, "response")
        assert request["WARC-Date"] == h["WARC-Date"]
        assert http[0] == str(doc.status_code)
    revisits = [(h, http) for h, kind, http, _ in records if kind == "revisit"]
    logs = {record_id(log.id, "revisit"): log
            for log in CrawlerDownloadLog.objects(job=job, not_modified__ne=None)}
    assert len(revisits) == len(logs) == 4  # a 304, and three pages answered with the same body
    profiles = {}
    for h, http in revisits:
        log = logs[h["WARC-Record-ID"]]
        assert log.fetched_at is not None and log.fetched_at <= log.add_datetime  # when the fetch began
        assert h["WARC-Date"] == log.fetched_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        target = h["WARC-Target-URI"]
        first = docs[next(k for k, d in docs.items() if d.url == target and (d.version or 1) == 1)]
        assert h["WARC-Refers-To"] == record_id(str(first.id), "response")
        assert h["WARC-Refers-To-Target-URI"] == target
        profiles[target.rsplit("/", 1)[-1]] = (h["WARC-Profile"].rsplit("/", 1)[-1], http[0])
    assert profiles == {pages["etag"]: ("server-not-modified", "304"),
                        pages["none"]: ("identical-payload-digest", "200"),
                        "3000": ("identical-payload-digest", "200"),
                        "shift_jis": ("identical-payload-digest", "200")}


def test_data_export_writes_a_warc_that_warcio_reads_back_exactly(cluster, crawled, tmp_path):
    path = tmp_path / "wa.warc.gz"
    done = cli("data", "export", "wa", "--format", "warc", "-o", str(path))
    assert done.exit_code == 0, done.output
    _assert_archive(path, crawled)
    assert task_of(crawled["changing"]).versions == 2


def test_the_export_center_writes_the_same_archive(cluster, crawled, tmp_path):
    done = cli("export", "request", "wa", "--format", "warc")
    assert done.exit_code == 0, done.output
    export_id = done.output.strip().splitlines()[-1]
    burst_worker(cluster)
    export = Export.objects.get(id=export_id)
    assert export.state == "SUCCESS", export.to_mongo()
    from common.store.exports import open_file

    path = tmp_path / "center.warc.gz"
    with open_file(export.file_id) as src, open(path, "wb") as out:
        shutil.copyfileobj(src, out)
    _assert_archive(path, crawled)
    info = read(path)[0]
    assert info[0]["WARC-Filename"] == "wa.warc.gz" and b"isPartOf: wa\r\n" in info[3]  # the job's name


def test_records_stream_each_written_before_the_next_is_read(cluster, crawled):
    """A WARC export holds one record at a time: the writer writes each download's records before
    it takes the next (the documents come from a cursor, in batches)."""
    from common.exports.warc import write_job
    from common.store.records import ExportFilter

    out, written = io.BytesIO(), []

    def wrap(items):
        for item in items:
            written.append(out.tell())  # the bytes out before this item was taken
            yield item

    assert write_job(Job.objects.get(name="wa").id, "wa", ExportFilter(), out, wrap) == 10 == len(written)
    assert 0 < written[0] and all(a < b for a, b in zip(written, written[1:])) and written[-1] < out.tell()


def test_a_template_with_warc_is_refused_and_nothing_is_written(cluster, crawled, tmp_path):
    template = tmp_path / "t.toml"
    template.write_text('[[columns]]\nname = "url"\ntitle = "URL"\n')
    out = tmp_path / "x.warc.gz"
    done = cli("data", "export", "wa", "--format", "warc", "--template", str(template), "-o", str(out))
    assert done.exit_code != 0 and "takes no template" in done.output and not out.exists()


@pytest.fixture(scope="session")
def pywb() -> Path:
    """The bin directory of pywb's own venv (its pins conflict with ours), which ``make test``
    builds under var/ before the tests run."""
    if not (PYWB_VENV / ".installed").exists():
        pytest.skip(f"pywb is not installed ({PYWB_VENV}: `make test` builds it, unless {PYWB} "
                    "cannot be installed on this machine)")
    return PYWB_VENV / "bin"


class Wayback:
    """pywb's wayback server over a collection made by ``wb-manager`` from one WARC file."""

    def __init__(self, bin_dir: Path, root: Path, warc: Path, coll: str = "wa") -> None:
        self.bin, self.root, self.coll = bin_dir, root, coll
        for args in (["init", coll], ["add", coll, str(warc)]):
            subprocess.run([str(bin_dir / "wb-manager"), *args], cwd=root, check=True, capture_output=True)
        self.index = (root / "collections" / coll / "indexes" / "index.cdxj").read_text()
        self.base = f"http://127.0.0.1:{free_port()}"

    def __enter__(self) -> "Wayback":
        self.log = tempfile.TemporaryFile(mode="w+", errors="replace")
        port = self.base.rsplit(":", 1)[1]
        self.proc = subprocess.Popen([str(self.bin / "wayback"), "-b", "127.0.0.1", "-p", port],
                                     cwd=self.root, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self._up, timeout=120, what="pywb's wayback server to answer")
        return self

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            self.log.seek(0)
            raise AssertionError("wayback exited: " + self.log.read()[-2000:])
        try:
            return requests.get(self.base + "/", timeout=5).status_code == 200
        except (requests.ConnectionError, requests.Timeout):
            return False

    def raw(self, timestamp: str, url: str) -> requests.Response:
        """The capture of ``url`` at ``timestamp`` as recorded (``id_``: no rewriting)."""
        return requests.get(f"{self.base}/{self.coll}/{timestamp}id_/{url}", timeout=60,
                            allow_redirects=False)

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def memento(answer: requests.Response) -> str:
    """The 14-digit time of the capture pywb answered with."""
    return parsedate_to_datetime(answer.headers["Memento-Datetime"]).strftime("%Y%m%d%H%M%S")


def test_pywb_replays_the_exported_pages_byte_exact(cluster, crawled, tmp_path, pywb):
    """Every capture in the index pywb builds replays the stored page: a response as stored, an
    identical-payload revisit as the page it matched; a server-not-modified revisit replays as
    the 304 it records (pywb's rule for a 3xx revisit), its original at its own time."""
    warc = tmp_path / "wa.warc.gz"
    assert cli("data", "export", "wa", "--format", "warc", "-o", str(warc)).exit_code == 0
    records = read(warc)
    job = Job.objects.get(name="wa")
    docs = {record_id(d.id, "response"): d for d in CrawlerDownloadData.objects(job=job)}
    stamp = {h["WARC-Record-ID"]: h["WARC-Date"][:19].translate(str.maketrans("", "", "-T:"))
             for h, _, _, _ in records}
    (tmp_path / "pywb").mkdir()
    with Wayback(pywb, tmp_path / "pywb", warc) as wayback:
        lines = [json.loads(line.split(" ", 2)[2]) for line in wayback.index.splitlines()]
        assert len(lines) == len(docs) + 4  # a line per response and per revisit
        replayed = 0
        for h, kind, http, _ in records:
            if kind not in ("response", "revisit"):
                continue
            replayed += 1
            rid = h["WARC-Record-ID"]
            got = wayback.raw(stamp[rid], h["WARC-Target-URI"])
            assert memento(got) == stamp[rid]  # this very capture, not a neighbour
            if kind == "revisit" and http[0] == "304":
                assert (got.status_code, got.content) == (304, b"")
                rid = h["WARC-Refers-To"]
                got = wayback.raw(stamp[rid], h["WARC-Target-URI"])
                assert memento(got) == stamp[rid]
            else:
                rid = h.get("WARC-Refers-To", rid)
            doc = docs[rid]
            assert got.status_code == doc.status_code
            assert got.content == bytes(doc.response_body)  # byte-exact as stored
        assert replayed == len(lines)


def test_a_revisit_refers_to_the_version_it_matched_not_an_earlier_one(cluster, tmp_path):
    """A page stored, visited unchanged, changed, visited unchanged again: the second revisit
    refers to the second version (its payload), not the first."""
    key = first_visit(cluster, tmp_path, "wv", ("none",), revisit=1.0)["none"]
    visit_again(cluster, "wv")  # the same body: a revisit of version 1
    sample_site.VERSIONED[key][0] = 2
    visit_again(cluster, "wv")  # version 2 stored
    visit_again(cluster, "wv")  # the same body: a revisit of version 2
    assert task_of(key).versions == 2 and sample_site.ANSWERS[key] == [200] * 4
    path = tmp_path / "wv.warc.gz"
    assert cli("data", "export", "wv", "--format", "warc", "-o", str(path)).exit_code == 0
    checked(path)
    records = read(path)
    versions = {d.version or 1: d for d in CrawlerDownloadData.objects(job=Job.objects.get(name="wv"))}
    revisits = [h for h, kind, _, _ in records if kind == "revisit"]
    assert [h["WARC-Refers-To"] for h in revisits] == [record_id(versions[v].id, "response") for v in (1, 2)]
    payloads = {h["WARC-Record-ID"]: h["WARC-Payload-Digest"]
                for h, kind, _, _ in records if kind == "response"}
    assert [h["WARC-Payload-Digest"] for h in revisits] == [payloads[h["WARC-Refers-To"]] for h in revisits]
    assert len(set(payloads.values())) == 2  # the two versions' bodies differ
