"""Calibration input: measurement files (one, several, or a folder of CSVs) as `CalibrationPoint`s.

Several files may describe several GPUs; one GPU named two ways (an alias and its catalog name) is merged into
the catalog name, and the calibration's notes say so. Every point keeps its "file: row N" source.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from tunecost.catalog.gpu_terms import GpuTerms
from tunecost.catalog.gpus import resolve_gpu_name
from tunecost.csvfile import read_csv_rows
from tunecost.errors import TunecostError
from tunecost.estimate.measurements import BUNDLED_MEASUREMENTS, Measurement, load_measurements
from tunecost.estimate.throughput.calibrate import CalibratedModel, calibrate
from tunecost.estimate.throughput.intervals import IntervalEvidence
from tunecost.estimate.throughput.targets import PAPER_RUN_QUERIES, CalibrationPoint, throughput_target
from tunecost.limits import MAX_QUERIES, check_count


def _optional_columns(path: Path) -> list[dict[str, str]]:
    return read_csv_rows(path, "measurements file")[1]


def points_from_measurements(
    measurements: Sequence[Measurement], extra: Sequence[Mapping[str, str]] = (), *, source: str = ""
) -> list[CalibrationPoint]:
    """Calibration points from `load_measurements` rows; `extra` (same order) may carry method, num_queries and
    host_cpu. With `source` (a file name), each point's `source` is "file: row N" and an error about a row names it."""
    out = []
    for i, m in enumerate(measurements):
        row = extra[i] if i < len(extra) else {}
        where = f"{source}: row {i + 1}" if source else ""
        try:
            method = (row.get("method") or "").strip() or None
            n = (row.get("num_queries") or "").strip()
            target = throughput_target(
                model=m.model,
                gpu=m.gpu,
                batch_size=m.batch_size,
                experts_per_token=m.experts_per_token,
                dataset=None if m.seq_len else m.dataset,
                seq_len=m.seq_len,
                method=method,
                host_cpu=(row.get("host_cpu") or "").strip() or None,
            )
        except (TunecostError, ValueError) as exc:
            raise TunecostError(f"{where or f'measurement {i + 1}'}: {exc}") from None
        try:
            run_queries = check_count("column 'num_queries'", float(n), MAX_QUERIES) if n else PAPER_RUN_QUERIES
        except ValueError:
            raise TunecostError(
                f"{where or f'measurement {i + 1}'}: column 'num_queries' is not a number: {n!r}"
            ) from None
        except TunecostError as exc:
            raise TunecostError(f"{where or f'measurement {i + 1}'}: {exc}") from None
        out.append(
            CalibrationPoint(target=target, queries_per_s=m.queries_per_s, run_queries=run_queries, source=where)
        )
    return out


def load_calibration_points(path: str | Path) -> list[CalibrationPoint]:
    """A measurements CSV (see `tunecost.estimate.measurements`), with optional method, num_queries and host_cpu
    columns. Each point's `source` is "file: row N", so later errors about a point name its row."""
    path = Path(path)
    return points_from_measurements(load_measurements(path), _optional_columns(path), source=str(path))


def calibration_files(paths: Sequence[str | Path]) -> list[Path]:
    """The CSV files named: files as given, folders expanded to their *.csv files (sorted), a comma-separated list
    (that is not itself a file) split. None found is an error."""
    files: list[Path] = []
    split: list[str | Path] = []
    for raw in paths:
        text = str(raw)
        if "," in text and not Path(text).exists():
            split.extend(part.strip() for part in text.split(",") if part.strip())
        else:
            split.append(raw)
    for raw in split:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("*.csv"))
            if not found:
                raise TunecostError(f"calibration folder {path} has no .csv files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise TunecostError(f"calibration file not found: {path}")
    if not files:
        raise TunecostError("no calibration files given")
    if len({f.resolve() for f in files}) != len(files):
        raise TunecostError("a calibration file is named twice: " + ", ".join(str(f) for f in files))
    return files


def alias_notes(points: Sequence[CalibrationPoint]) -> list[str]:
    """One note per GPU that the points name in more than one way (they are merged under the catalog name)."""
    names: dict[str, set[str]] = defaultdict(set)
    for p in points:
        names[resolve_gpu_name(p.target.gpu).gpu.name].add(p.target.gpu.strip())
    return [
        f"GPU {gpu} is named {', '.join(repr(n) for n in sorted(spelled))} in the calibration: merged as {gpu}"
        for gpu, spelled in sorted(names.items())
        if len(spelled) > 1
    ]


def calibrate_files(paths: Sequence[str | Path], *, gpu_terms: Mapping[str, GpuTerms] | None = None) -> CalibratedModel:
    """Calibrate on every point of every file (see `calibration_files`)."""
    files = calibration_files(paths)
    points = [p for f in files for p in load_calibration_points(f)]
    source = " + ".join(str(f) for f in files)
    model = calibrate(points, source=source, gpu_terms=gpu_terms, fallback_evidence=bundled_evidence)
    return replace(model, notes=(*model.notes, *alias_notes(points)))


def bundled_evidence() -> IntervalEvidence | None:
    """The held-out errors of the calibration on every bundled measurement (the paper's A40 and A100-40GB):
    what a calibration on one GPU borrows for the move to another."""
    points = [p for f in BUNDLED_MEASUREMENTS for p in load_calibration_points(f)]
    evidence = calibrate(points, source="bundled measurements").evidence
    if evidence is None or evidence.transfer is None:
        return None
    note = f"the bundled calibration's {len(evidence.transfer.errors)} held-out errors ({evidence.transfer.source})"
    return replace(evidence, note=note)
