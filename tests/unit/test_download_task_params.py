"""A download task's parameters are a typed record (``DownloadTaskParams``) whose stored form is
the ``center`` document the center has always written: the same keys, in the same order, with the
same values, so a document made now is the same BSON, byte for byte, as one made before the
record existed. The documents below were made by the center before it (a /v1 Excel download task
pulled from a source_url; an /api/v1 one of two tables given inline). No services needed.
"""
from __future__ import annotations

import bson
from bson import ObjectId

from common.exports.sources import look_of, pull_options
from common.store.records import DownloadTaskParams, ExportRecord

V1_EXCEL = {
    "name": "v1 xlsx", "file_name": "x", "step": 1000, "operator_id": None, "merchant_type": None,
    "merchant_id": 4, "source_url": "https://x.example/r", "tables": 1, "template": '{"a": "A"}',
    "title": [None], "summary": [None], "header": [None], "footer": [None], "default_width": None,
    "default_height": None, "v1": True, "interval": 100, "rowoffset": 3, "header_align": "center",
    "footer_align": "right"}
TWO_TABLES = {
    "name": "multi", "file_name": "m", "step": 1000, "operator_id": None, "merchant_type": None,
    "merchant_id": None, "source_data": '[[{"a": 1}], [{"b": 2}, {"b": 3}]]', "tables": 2,
    "template": None, "title": ["t1", "t2"], "summary": [None, None], "header": [[["a", "b"]], None],
    "footer": [None, None], "default_width": None, "default_height": None}


def test_a_stored_document_reads_and_writes_back_byte_for_byte():
    for doc in (V1_EXCEL, TWO_TABLES):
        params = DownloadTaskParams.from_doc(bson.decode(bson.encode(doc)))
        assert bson.encode(params.to_doc()) == bson.encode(doc)
    v1 = DownloadTaskParams.from_doc(V1_EXCEL)
    assert (v1.v1, v1.rowoffset, v1.header_align, v1.col_align) == (True, 3, "center", None)
    assert v1.source_data is None and v1.source_url == "https://x.example/r"
    two = DownloadTaskParams.from_doc(TWO_TABLES)
    assert two.header == ((("a", "b"),), None) and two.tables == 2 and not two.v1


def test_the_export_carries_its_parameters_typed_and_a_jobs_export_stores_an_empty_center():
    task = ExportRecord(id=ObjectId(), format="xlsx", digest="center:x", project=7,
                        center=DownloadTaskParams.from_doc(V1_EXCEL))
    doc = task.to_doc()
    assert bson.encode(doc["center"]) == bson.encode(V1_EXCEL)
    assert ExportRecord.from_doc(doc) == task
    job_export = ExportRecord(id=ObjectId(), format="csv", digest="d", job=ObjectId(), job_name="j")
    doc = job_export.to_doc()
    assert doc["center"] == {} and list(doc).index("center") == list(doc).index("job_name") + 1
    assert ExportRecord.from_doc(doc).center is None


def test_the_look_and_the_pull_read_the_record():
    look = look_of(DownloadTaskParams.from_doc(TWO_TABLES))
    assert look.title == ("t1", "t2") and look.header == ((("a", "b"),), None) and look.v1 is None
    v1 = DownloadTaskParams.from_doc(V1_EXCEL)
    assert look_of(v1).v1 == v1 and pull_options(v1)["interval"] == 0.1
