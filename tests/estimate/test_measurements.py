"""Reading throughput measurements (CSV): the columns of the paper artifact's A40 measurements,
and one clear error per kind of bad input, naming the column, row or group."""

from __future__ import annotations

import pytest

from tunecost.errors import TunecostError
from tunecost.estimate.measurements import REQUIRED_COLUMNS, load_measurements

MEASUREMENT_HEADER = "model,dataset,gpu,experts_per_token,sparsity,batch_size,queries_per_s"


def _csv(*rows: str, header: str = MEASUREMENT_HEADER) -> str:
    return "\n".join([header, *rows]) + "\n"


def test_paper_csv_loads(paper_a40_csv) -> None:
    points = load_measurements(paper_a40_csv)
    assert len(points) == 54  # 55 lines in the paper's CSV, one header
    first = points[0]  # mixtral-8x7b,commonsense_15k,A40-48GB,8,1.0,1,0.3213791846
    assert (first.model, first.dataset, first.gpu) == ("mixtral-8x7b", "commonsense_15k", "A40-48GB")
    assert (first.experts_per_token, first.sparsity, first.batch_size) == (8, 1.0, 1)
    assert first.queries_per_s == pytest.approx(0.3213791846)
    assert first.seq_len is None
    assert {p.sparsity for p in points} == {0.25, 1.0}


def test_files_concatenated_with_their_headers_load_as_one(tmp_path) -> None:
    """`cat a40.csv a100.csv > cal.csv` repeats the header (and the second file's comment) mid-file: both are
    skipped, and the rows are those of the two files."""
    from tunecost.estimate.measurements import BUNDLED_MEASUREMENTS

    joined = tmp_path / "cal.csv"
    joined.write_text("".join(p.read_text(encoding="utf-8") for p in BUNDLED_MEASUREMENTS), encoding="utf-8")
    separately = [m for p in BUNDLED_MEASUREMENTS for m in load_measurements(p)]
    assert load_measurements(joined) == separately


def test_sparsity_defaults_to_k_over_experts(write_file) -> None:
    text = _csv(
        "mixtral-8x7b,cs,A40,2,1,0.5",
        "olmoe-1b-7b,cs,A40,8,1,0.5",
        "unknown-model,cs,A40,4,1,0.5",
        header="model,dataset,gpu,experts_per_token,batch_size,queries_per_s",
    )
    points = load_measurements(write_file("m.csv", text))
    # Mixtral: 2 of 8 experts (catalog); OLMoE: 8 of 64 (catalog); a model not in the catalog: of 8 (the paper's)
    assert [p.sparsity for p in points] == [0.25, 0.125, 0.5]


def test_comments_and_seq_len(write_file) -> None:
    text = "# a comment line\n" + _csv("m,d,g,2,0.25,3,1.5,512", header=MEASUREMENT_HEADER + ",seq_len")
    (point,) = load_measurements(write_file("m.csv", text))
    assert point.seq_len == 512 and point.batch_size == 3


def test_a_utf8_bom_is_not_part_of_the_first_column(write_file) -> None:
    """Spreadsheets save CSV with a byte-order mark; the first column is still `model`."""
    text = "\ufeff" + _csv("m,d,g,2,0.25,3,1.5", header=MEASUREMENT_HEADER)
    (point,) = load_measurements(write_file("m.csv", text))
    assert point.model == "m" and point.batch_size == 3


@pytest.mark.parametrize("column", REQUIRED_COLUMNS)
def test_missing_column_is_named(write_file, column: str) -> None:
    header = ",".join(c for c in MEASUREMENT_HEADER.split(",") if c != column)
    row = ",".join(
        v for c, v in zip(MEASUREMENT_HEADER.split(","), ["m", "d", "g", "2", "0.25", "1", "0.5"]) if c != column
    )
    with pytest.raises(TunecostError, match=rf"missing column\(s\) {column};"):
        load_measurements(write_file("m.csv", _csv(row, header=header)))


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("m,d,g,two,0.25,1,0.5", "experts_per_token"),
        ("m,d,g,2,0.25,one,0.5", "batch_size"),
        ("m,d,g,2,0.25,1,fast", "queries_per_s"),
        ("m,d,g,2,quarter,1,0.5", "sparsity"),
        ("m,d,g,2,0.25,1", "queries_per_s"),  # a short row: the cell is absent
    ],
)
def test_non_numeric_cell_names_row_and_column(write_file, row: str, column: str) -> None:
    text = _csv("m,d,g,2,0.25,1,0.5", "m,d,g,2,0.25,2,0.8", row)
    with pytest.raises(TunecostError, match=rf"row 3: column '{column}' is not a number"):
        load_measurements(write_file("m.csv", text))


@pytest.mark.parametrize("cell", ["nan", "inf"])
@pytest.mark.parametrize("column_index", [5, 6])  # batch_size, queries_per_s
def test_non_finite_cell_names_row(write_file, cell: str, column_index: int) -> None:
    # float() accepts "nan"/"inf"; they are not usable measurements and must be a one-line error naming the row
    # (today: a NaN queries_per_s is accepted and crashes scipy later; a NaN batch_size raises ValueError).
    cells = ["m", "d", "g", "2", "0.25", "2", "0.8"]
    cells[column_index] = cell
    text = _csv("m,d,g,2,0.25,1,0.5", ",".join(cells))
    with pytest.raises(TunecostError, match="row 2"):
        load_measurements(write_file("m.csv", text))


def test_whole_number_columns(write_file) -> None:
    with pytest.raises(TunecostError, match=r"row 1: column 'batch_size' must be a whole number, got '1.5'"):
        load_measurements(write_file("m.csv", _csv("m,d,g,2,0.25,1.5,0.5")))


def test_empty_file(write_file) -> None:
    with pytest.raises(TunecostError, match=r"missing column\(s\) model, dataset, gpu.*found none"):
        load_measurements(write_file("m.csv", ""))


def test_header_only(write_file) -> None:
    with pytest.raises(TunecostError, match="no measurements"):
        load_measurements(write_file("m.csv", _csv()))


def test_missing_file(tmp_path) -> None:
    with pytest.raises(TunecostError, match="measurements file not found"):
        load_measurements(tmp_path / "nope.csv")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("m,d,g,2,0.25,1,0", "row 2: queries_per_s must be between"),
        ("m,d,g,2,0.25,1,-0.5", "row 2: queries_per_s must be between"),
        ("m,d,g,2,0.25,1,1e300", r"row 2: queries_per_s must be between 1e-06 and 1e\+06, got 1e\+300"),
        ("m,d,g,2,0.25,1,5e-324", r"row 2: queries_per_s must be between 1e-06 and 1e\+06, got 4.94066e-324"),
        ("m,d,g,2,0.25,0,0.5", "row 2: experts_per_token and batch_size must be >= 1"),
        ("m,d,g,2,0.25,-3,0.5", "row 2: experts_per_token and batch_size must be >= 1"),
        ("m,d,g,0,0.25,1,0.5", "row 2: experts_per_token and batch_size must be >= 1"),
        ("m,d,g,2,0,1,0.5", r"row 2: sparsity must be in \(0, 1\]"),
        ("m,d,g,2,1.5,1,0.5", r"row 2: sparsity must be in \(0, 1\]"),
        (",d,g,2,0.25,1,0.5", "row 2: empty 'model'"),
        ("m,d, ,2,0.25,1,0.5", "row 2: empty 'gpu'"),
    ],
)
def test_out_of_range_values_name_row(write_file, row: str, message: str) -> None:
    with pytest.raises(TunecostError, match=message):
        load_measurements(write_file("m.csv", _csv("m,d,g,2,0.25,1,0.5", row)))


def test_too_few_points_names_group(write_file) -> None:
    from tunecost.estimate.fit import fit_all

    text = _csv("m,d,g,2,0.25,1,0.5", "m,d,g,2,0.25,2,0.8", "m,d,g,2,0.25,3,1.0", "m,other,g,2,0.25,1,0.4")
    with pytest.raises(TunecostError, match=r"group m/other/g has 1 point\(s\)"):
        fit_all(load_measurements(write_file("m.csv", text)))


def test_errors_are_one_line(write_file) -> None:
    with pytest.raises(TunecostError) as info:
        load_measurements(write_file("m.csv", _csv("m,d,g,2,0.25,1,fast")))
    assert "\n" not in str(info.value)
    assert "m.csv" in str(info.value)  # names the file


def test_seq_len_below_one_names_the_row(write_file) -> None:
    text = _csv("m,d,g,2,0.25,3,1.5,512", "m,d,g,2,0.25,3,1.5,0", header=MEASUREMENT_HEADER + ",seq_len")
    with pytest.raises(TunecostError, match=r"row 2: seq_len must be between 1 and 1048576, got 0"):
        load_measurements(write_file("m.csv", text))
