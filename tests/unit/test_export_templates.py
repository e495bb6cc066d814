"""Export templates and files without a store: templates parsed and refused with one line, header
trees laid out, export filters checked, an xlsx continued on new sheets with cells capped."""
from __future__ import annotations

import csv
import io
import json
from datetime import datetime

import pytest

from common.errors import ValidationError
from common.exports.templates import parse_template, place
from common.store.records import ExportFilter
from master.exports import service as exports
from tests.helpers import TEMPLATE


@pytest.mark.parametrize(
    "text,why",
    [
        ("[[columns]]\nfield = 'nope'\n", "unknown field 'nope'"),
        (
            "[[columns]]\nfield = 'url'\nheader = ['a', 'b']\n[[columns]]\nfield = 'task'\nheader = ['c']\n",
            "ragged",
        ),
        ("columns = [", "not valid TOML"),
        ("sheet = 'a/b'\n[[columns]]\nfield = 'url'\n", "sheet"),
        ("[[columns]]\nfield = 'url'\ncolour = 'red'\n", "takes only"),
    ],
)
def test_bad_templates_are_refused_with_one_line(text, why):
    with pytest.raises(ValidationError) as err:
        parse_template(text)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_header_trees_are_laid_out_as_seed_000_says():
    """Depth is the row; the first child starts under its parent, the next after its elder
    siblings' breadth; an inner node spans its leaves, a leaf reaches the deepest row (a row
    leaf spans its row_count)."""
    table = parse_template(
        json.dumps(
            [
                {
                    "title": "Person",
                    "children": [
                        {"title": "Name", "name": "url"},
                        {
                            "title": "Other",
                            "children": [
                                {"title": "Age", "name": "status_code"},
                                {"title": "Sex", "name": "encoding"},
                            ],
                        },
                    ],
                },
                {"title": "Note", "name": "hostname"},
            ]
        )
    ).tables[0]
    got = {(p.node.title, p.level, p.offset, p.levels, p.span) for p in place(table.col)}
    assert got == {("Person", 0, 0, 1, 3), ("Name", 1, 0, 2, 1), ("Other", 1, 1, 1, 2), ("Age", 2, 1, 1, 1),
                   ("Sex", 2, 2, 1, 1), ("Note", 0, 3, 3, 1)}
    rows = parse_template(json.dumps({"col": [{"name": "url"}], "row_field": "status_code", "row": [
        {"title": "Cloud", "children": [{"title": "front", "name": "200", "row_count": 2},
                                        {"title": "back", "name": "404", "row_count": 4}]},
        {"title": "OS", "name": "500"}]})).tables[0]
    got = {(p.node.title, p.level, p.offset, p.levels, p.span) for p in place(rows.row, rows=True)}
    assert got == {("Cloud", 0, 0, 1, 6), ("front", 1, 0, 1, 2), ("back", 1, 2, 1, 4), ("OS", 0, 6, 2, 1)}
    # the first template form groups neighbours with equal header prefixes
    legacy = parse_template(TEMPLATE).tables[0]
    assert [n.title for n in legacy.col] == ["Request", "Response", "Fetched"]
    assert [c.title for c in legacy.columns] == ["URL", "Status", "Size", "At"]


@pytest.mark.parametrize(
    "text,why",
    [
        ('{"col": [{"title": "a", "name": "url", "children": [{"name": "url"}]}]}', "not both"),
        ('{"col": [{"name": "url"}], "row": [{"name": "200"}]}', "row headers need row_field"),
        (
            '{"col": [{"name": "url"}], "row_field": "hostname", "row": [{"name": "a", "row_count": 0}]}',
            "row_count",
        ),
        (
            '{"col": [{"name": "url"}], "row_field": "hostname", "row": [{"name": "a"}, {"name": "a"}]}',
            "same value",
        ),
        ('{"tables": [{"col": [{"name": "url"}]}], "title": "x"}', "inside each table"),
        ('{"tables": []}', "tables must be"),
        ('{"col": [{"name": "url", "width": 0}]}', "width"),
        ('{"col": [{"name": "url"}], "header": {"a": {"b": 1}}}', "header.a"),
        ('{"col": [{"name": "url"}], "status": ["200"]}', "status"),
        ('{"col": [{"name": "url"}', "not valid JSON"),
        ('[{"title": "x", "children": ' * 9 + '[{"name": "url"}]' + "}]" * 9, "deeper than"),
    ],
)
def test_bad_seed_templates_are_refused_with_one_line(text, why):
    with pytest.raises(ValidationError) as err:
        parse_template(text)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_seed_short_forms_are_one_template():
    as_map = parse_template('{"url": "Address", "status_code": "Status"}')
    as_list = parse_template(
        '[{"name": "url", "title": "Address"}, {"name": "status_code", "title": "Status"}]'
    )
    as_col = parse_template(
        '{"col": [{"name": "url", "title": "Address"}, {"name": "status_code", "title": "Status"}]}'
    )
    as_toml = parse_template(
        '[[col]]\nname = "url"\ntitle = "Address"\n[[col]]\nname = "status_code"\ntitle = "Status"\n'
    )
    assert as_map == as_list == as_col == as_toml
    assert as_map.canonical() == as_toml.canonical() and as_map.plain


def test_filter_checks():
    flt = exports.check_filter({"status": ["200", 404, 200], "since": "2026-01-01T00:00:00Z"})
    assert flt == ExportFilter(status=(200, 404), since=datetime(2026, 1, 1))
    assert flt.to_doc() == {"status": [200, 404], "since": datetime(2026, 1, 1)}  # as stored
    assert ExportFilter.from_doc(flt.to_doc()) == flt
    assert exports.check_filter(
        {"since": "2016-12-31t23:59:60.5+01:00"}
    ) == ExportFilter(since=datetime(2016, 12, 31, 22, 59, 59, 999999))  # RFC 3339: a leap second, lower case
    assert exports.check_filter({"versions": "all"}).to_doc() == {"versions": "all"}
    assert exports.check_filter(None) == exports.check_filter({"versions": "latest"}) == ExportFilter()
    for bad in ({"status": ["ok"]}, {"status": [{"$ne": 1}]}, {"since": "yesterday"}, {"since": {"$gt": ""}},
                {"where": 1}, {"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
                {"since": "2026-02-01"}, {"until": ""}):
        with pytest.raises(ValidationError):
            exports.check_filter(bad)


def test_xlsx_continues_on_a_new_sheet_past_the_row_limit_and_caps_cells(monkeypatch):
    import openpyxl

    from common.exports import sheets, tabular

    monkeypatch.setattr(sheets, "EXCEL_MAX_ROWS", 5)  # 2 header rows + 3 data rows a sheet
    template = parse_template(TEMPLATE.replace('field = "response_size"', 'field = "body_text"'))
    rows = [
        {"url": f"u{i}", "status_code": 200, "body_text": "x" * 40_000, "add_datetime": datetime(2026, 1, 1)}
        for i in range(8)
    ]
    out = io.BytesIO()
    assert sheets.write_xlsx(template, iter(rows), out) == 8
    book = openpyxl.load_workbook(io.BytesIO(out.getvalue()))
    assert book.sheetnames == ["pages", "pages (2)", "pages (3)"]
    assert [book[n].max_row for n in book.sheetnames] == [5, 5, 4]
    second = book["pages (2)"]
    assert second["A3"].value == "u3" and {str(r) for r in second.merged_cells.ranges} == {"B1:C1"}
    assert len(second["C3"].value) == sheets.EXCEL_MAX_CELL
    text = io.BytesIO()
    tabular.write_csv(template, iter(rows[:1]), text)
    assert (
        max(len(cell) for cell in next(csv.reader(io.StringIO(text.getvalue().decode().splitlines()[1]))))
        == sheets.EXCEL_MAX_CELL
    )
