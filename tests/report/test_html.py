"""The report page (tunecost.report.html): its numbers are the records' numbers, it is
self-contained, and bad or partial input gives a report without the affected section."""

from __future__ import annotations

import base64
import math
import re
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from tunecost.errors import TunecostError
from tunecost.report.figures import SECTIONS
from tunecost.report.html import build_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _shown(cell: str, value: float, decimals: int | None = None) -> None:
    """`cell` is `value` as the report shows it: rounded to `decimals` if it rounds, then 4 significant digits
    (below 1000) or whole numbers (from 1000 up)."""
    expected = round(value, decimals) if decimals is not None else value
    text = f"{expected:.4g}" if abs(expected) < 1000 else f"{expected:.0f}"
    assert cell == text, f"shown {cell!r}, records give {value!r} -> {text!r}"


# --- the report's numbers are the records' numbers ---------------------------------------------------------------


def test_fit_table_matches_a_least_squares_refit_of_the_points(full_page: str, full_run: Path, tables, rows) -> None:
    """Refit eq. (2) (artifact form: q = a + b*log(B)/(sparsity*c3)) on the fit_point rows with numpy and find
    the coefficients and RMSE in the Fig. 14 table."""
    points = [r for r in rows(full_run, "fit") if r["kind"] == "fit_point"]
    fits = {
        (r["model"], r["dataset"]): r for r in rows(full_run, "fit") if r["kind"] == "fit" and r["form"] == "artifact"
    }
    table = tables(full_page)["fit"]
    assert len(table) == len(fits) == 4
    for row in table:
        key = (row["model"], row["dataset"], row["gpu"])
        group = [p for p in points if (p["model"], p["dataset"], p["gpu"]) == key]
        c3 = fits[(row["model"], row["dataset"])]["coefficients"]["c3"]
        x = np.array([math.log(p["batch_size"]) / (p["sparsity"] * c3) for p in group])
        y = np.array([p["queries_per_s"] for p in group])
        b, a = np.polyfit(x, y, 1)
        rmse = math.sqrt(float(np.mean((a + b * x - y) ** 2)))
        mape = float(np.mean(np.abs(a + b * x - y) / y))
        assert row["coefficients"] == f"a={a:.4g}, b={b:.4g}, c3={c3:.4g}"
        _shown(row["rmse_qps"], rmse, 4)
        _shown(row["mape_pct"], 100 * mape, 2)
        assert row["points"] == str(len(group))


def test_cost_table_shows_the_cheapest_provider_per_gpu(full_page: str, full_run: Path, tables, rows) -> None:
    cheapest: dict[tuple, dict] = {}
    for r in rows(full_run, "estimate"):
        if r["usd"] is None:
            continue
        key = (r["model"], r["experts_per_token"], r["estimator"], r["gpu"])
        if key not in cheapest or r["usd"] < cheapest[key]["usd"]:
            cheapest[key] = r
    table = tables(full_page)["costs"]
    assert len(table) == len(cheapest) > 0
    for row in table:
        best = cheapest[(row["model"], int(row["experts_per_token"]), row["estimator"], row["gpu"])]
        assert (row["provider"], row["price_date"]) == (best["provider"], best["price_date"])
        _shown(row["usd"], best["usd"], 2)
        _shown(row["usd_per_hour"], best["usd_per_hour"])
        _shown(row["hours"], best["hours"], 1)
    # more than one provider per GPU in the records, so "cheapest" chose something
    providers = {(r["gpu"], r["provider"]) for r in rows(full_run, "estimate") if r["usd"] is not None}
    assert len(providers) > len({gpu for gpu, _ in providers})


def test_stage_table_is_the_median_over_repeats_in_ms(full_page: str, full_run: Path, tables, rows) -> None:
    table = {row["config"]: row for row in tables(full_page)["stages"]}
    assert len(table) == 8
    for model in ("tiny-mixtral", "tiny-blackmamba"):
        for k, name in ((2, "top-2"), (8, "dense")):
            for b in (2, 4):
                for stage in ("forward", "backward", "optimizer"):
                    seconds = [
                        r["seconds"]
                        for r in rows(full_run, "stages")
                        if (r["model"], r["experts_per_token"], r["batch_size"], r["stage"]) == (model, k, b, stage)
                    ]
                    assert len(seconds) == 3
                    _shown(table[f"{model} {name} bsz={b}"][stage], 1e3 * statistics.median(seconds), 2)


def test_expert_load_variance_and_counts(full_page: str, full_run: Path, tables, rows) -> None:
    table = {(row["model"], row["phase"]): row for row in tables(full_page)["expert_load"]}
    assert len(table) == 4
    for model in ("tiny-mixtral", "tiny-blackmamba"):
        for phase in ("before", "after"):
            tokens = [0] * 8
            for r in rows(full_run, "expert_load"):
                if (r["model"], r["phase"]) == (model, phase):
                    tokens[r["expert"]] += r["tokens"]
            _shown(table[model, phase]["variance"], statistics.pvariance(tokens), 1)
            assert [table[model, phase][f"expert_{e}"] for e in range(8)] == [str(t) for t in tokens]
        # the fixture skews "after"
        assert float(table[model, "after"]["variance"]) > float(table[model, "before"]["variance"])


def test_accuracy_at_the_last_epoch(full_page: str, full_run: Path, tables, rows) -> None:
    table = tables(full_page)["trainability"]
    last = max(r["epoch"] for r in rows(full_run, "trainability"))
    shown = next(row for row in table if row["epoch"] == str(last))
    for routing in ("dense", "sparse"):
        acc = next(
            r["accuracy"] for r in rows(full_run, "trainability") if r["routing"] == routing and r["epoch"] == last
        )
        _shown(shown[routing], acc, 3)


def test_max_batch_table_has_every_record(full_page: str, full_run: Path, tables, rows) -> None:
    shown = {
        (r["gpu"], r["experts_per_token"], r["source"]): r["max_batch_size"] for r in tables(full_page)["max_batch"]
    }
    records = rows(full_run, "max_batch")
    assert len(shown) == len(records)
    for r in records:
        assert shown[(r["gpu"], str(r["experts_per_token"]), r["source"])] == str(r["max_batch_size"])


def test_tables_have_no_spurious_pivot_column(full_page: str) -> None:
    """A pivot's column name (stage, component, kernel_class, routing) must not become a header cell over an
    empty column."""
    assert "<th></th>" not in full_page
    for name in ("stage", "component", "kernel_class", "routing"):
        assert f"<th>{name}</th>" not in full_page


def test_caption_names_device_and_versions(full_page: str) -> None:
    assert "device: kind cpu, name Test CPU" in full_page
    assert "transformers 5.23.0" in full_page
    assert "on NVIDIA H100 80GB HBM3" in full_page  # the counters' device
    assert "<td>paper</td>" in full_page  # the estimator of each cost row


# --- self-contained page ------------------------------------------------------------------------------------------


def test_every_section_is_shown_with_full_records(full_report) -> None:
    assert full_report.sections_omitted == {}
    assert full_report.sections_shown == tuple(s.key for s in SECTIONS)


def test_page_is_self_contained(full_page: str) -> None:
    assert "<script" not in full_page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", full_page, re.IGNORECASE)
    assert "@import" not in full_page and "url(" not in full_page
    for attr in re.findall(r"""\b(?:src|href)\s*=\s*["']([^"']*)""", full_page, re.IGNORECASE):
        assert attr.startswith("data:image/png;base64,"), attr[:60]


def test_every_figure_is_an_embedded_png_with_files_beside(full_report, full_page: str) -> None:
    images = re.findall(r"<img alt='([a-z_]+)' src='data:image/png;base64,([A-Za-z0-9+/=]+)'>", full_page)
    assert [key for key, _ in images] == list(full_report.sections_shown)
    assert len(re.findall(r"<img\b", full_page)) == len(images)
    fig_dir = full_report.html_path.parent / "figures"
    for key, data in images:
        png = base64.b64decode(data, validate=True)
        assert png.startswith(PNG_MAGIC)
        assert (fig_dir / f"{key}.png").read_bytes() == png
        assert ET.parse(fig_dir / f"{key}.svg").getroot().tag.endswith("svg")
    assert sorted(p.name for p in full_report.figure_paths) == sorted(
        f"{key}.{ext}" for key, _ in images for ext in ("png", "svg")
    )


def test_html_in_record_values_is_escaped(tmp_path: Path, make_run, rows) -> None:
    run = make_run(tmp_path / "run", kinds=("throughput", "max_batch"))
    path = run / "max_batch.jsonl"
    text = path.read_text(encoding="utf-8").replace('"mixtral-8x7b"', '"<script>alert(1)</script>"')
    path.write_text(text, encoding="utf-8")
    page = build_report(run).html_path.read_text(encoding="utf-8")
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_out_elsewhere_puts_figures_beside_it(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("trainability",))
    result = build_report(run, tmp_path / "site" / "index.html")
    assert result.html_path == tmp_path / "site" / "index.html"
    assert {p.name for p in (tmp_path / "site" / "figures").iterdir() if not p.name.startswith(".")} == {
        "trainability.png",
        "trainability.svg",
    }
    assert not (run / "report.html").exists()


def test_rebuilding_gives_the_same_page(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("trainability", "throughput"))
    first = build_report(run).html_path.read_text(encoding="utf-8")
    second = build_report(run).html_path.read_text(encoding="utf-8")
    assert first == second
    assert first.count("<h2") == len(SECTIONS) + 1  # the summary, then one heading per section


def test_max_batch_without_gpu_memory_is_a_table_without_figure(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("max_batch",), drop_columns={"max_batch": ("gpu_memory_gb",)})
    result = build_report(run)
    page = result.html_path.read_text(encoding="utf-8")
    assert result.sections_shown == ("max_batch",)
    assert "<img" not in page and result.figure_paths == ()
    assert page.count("<td>mixtral-8x7b</td>") == 20


# --- bad input ---------------------------------------------------------------------------------------------------


def test_no_records_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text("{}", encoding="utf-8")
    with pytest.raises(TunecostError, match="holds no run records"):
        build_report(tmp_path)
    assert not (tmp_path / "report.html").exists()


def test_missing_run_dir_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TunecostError, match="run directory not found"):
        build_report(tmp_path / "missing")


def test_older_format_is_listed_and_the_report_still_built(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("trainability", "stages"), schema_version={"stages": 0})
    result = build_report(run)
    page = result.html_path.read_text(encoding="utf-8")
    assert "Records not read:" in page
    assert "stages.jsonl: records in format version [&#x27;0&#x27;]" in page
    assert result.sections_omitted["stages"] == "no `stages.jsonl` records in this run"
    assert "trainability" in result.sections_shown


def test_only_older_format_records_still_give_a_page(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("throughput",), schema_version={"throughput": 0})
    result = build_report(run)
    assert result.sections_shown == ()
    assert "throughput.jsonl: records in format version" in result.html_path.read_text(encoding="utf-8")


def test_missing_kinds_are_omitted_each_with_its_reason(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("fit", "estimate"))
    result = build_report(run)
    page = result.html_path.read_text(encoding="utf-8")
    assert result.sections_shown == ("fit", "costs")
    for key in (
        "lengths",
        "trainability",
        "stages",
        "layers",
        "kernels",
        "throughput",
        "counters",
        "expert_load",
        "max_batch",
        "multi_gpu",
        "ranks",
    ):
        reason = f"no `{key}.jsonl` records in this run"
        assert result.sections_omitted[key] == reason
        assert f"<p class='omitted'>Omitted: {reason}</p>" in page
    assert "placeholder" not in page.lower()


def test_missing_column_omits_only_that_section(tmp_path: Path, make_run) -> None:
    run = make_run(
        tmp_path / "run", kinds=("throughput", "trainability"), drop_columns={"throughput": ("queries_per_s",)}
    )
    result = build_report(run)
    assert result.sections_omitted["throughput"] == (
        "`throughput.jsonl` lacks queries_per_s (written by an older or partial run)"
    )
    assert "trainability" in result.sections_shown
    assert not (result.html_path.parent / "figures" / "throughput.png").exists()


def test_column_null_in_every_row_is_missing(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("layers",))
    path = run / "layers.jsonl"
    path.write_text(
        re.sub(r'"seconds": [0-9.e-]+', '"seconds": null', path.read_text(encoding="utf-8")), encoding="utf-8"
    )
    result = build_report(run)
    assert result.sections_omitted["layers"] == "`layers.jsonl` lacks seconds (written by an older or partial run)"


@pytest.mark.parametrize("column", ["model", "rmse", "coefficients", "sparsity"])
def test_fit_records_missing_a_column_never_crash(tmp_path: Path, make_run, column: str) -> None:
    run = make_run(tmp_path / "run", kinds=("fit",), drop_columns={"fit": (column,)})
    result = build_report(run)
    assert result.sections_omitted["fit"] == f"`fit.jsonl` lacks {column} (written by an older or partial run)"


def test_unreadable_values_omit_the_section_not_the_report(tmp_path: Path, make_run) -> None:
    """Values of the wrong type (a string where a number belongs): the section is omitted with the error."""
    run = make_run(tmp_path / "run", kinds=("throughput", "trainability"))
    path = run / "trainability.jsonl"
    path.write_text(
        re.sub(r'"accuracy": [0-9.]+', '"accuracy": "n/a"', path.read_text(encoding="utf-8")), encoding="utf-8"
    )
    result = build_report(run)
    assert "throughput" in result.sections_shown
    assert result.sections_omitted["trainability"] == (
        "records could not be read (ValueError: could not convert string to float: 'n/a')"
    )


def test_report_never_writes_onto_run_records(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("throughput",))
    records = run / "throughput.jsonl"
    before = records.read_bytes()
    with pytest.raises(TunecostError, match="inputs"):
        build_report(run, records, force=True)
    assert records.read_bytes() == before


def test_report_owns_its_figures_folder(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("trainability", "throughput"))
    paper = tmp_path / "paper"
    (paper / "figures").mkdir(parents=True)
    mine = paper / "figures" / "plot.png"
    mine.write_bytes(b"user's figure")
    with pytest.raises(TunecostError, match="did not write"):
        build_report(run, paper / "report.html")
    assert not (paper / "report.html").exists() and sorted((paper / "figures").iterdir()) == [mine]
    build_report(run, paper / "report.html", force=True)  # writes beside the foreign file, keeps it
    assert mine.read_bytes() == b"user's figure"
    # own stale figures go: a second report without the throughput section removes throughput.png
    first = build_report(run)
    assert (run / "figures" / "throughput.png").exists()
    (run / "throughput.jsonl").unlink()
    second = build_report(run)
    assert "throughput" in first.sections_shown and "throughput" not in second.sections_shown
    assert not (run / "figures" / "throughput.png").exists()


def test_report_keeps_a_foreign_html_without_force(tmp_path: Path, make_run) -> None:
    run = make_run(tmp_path / "run", kinds=("trainability",))
    page = tmp_path / "index.html"
    page.write_text("<p>my page</p>", encoding="utf-8")
    with pytest.raises(TunecostError, match="not a tunecost report"):
        build_report(run, page)
    assert page.read_text(encoding="utf-8") == "<p>my page</p>"
    assert not (tmp_path / "figures").exists()
