"""Shared test fixtures. Tests read only files in the repository: data they need is under tests/fixtures/."""

from __future__ import annotations

import json
import os
import sys
import tempfile

# Idle OpenMP threads spin by default; with 2 cores that starves the next op. Set before torch loads. One torch
# thread per process for make test's tests (tiny tensors, a worker per core: 434 s against 475 s with torch's default
# of a thread per core, one fresh-clone run each); the `long` ones keep the default (`_long_tests_use_every_core`).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No test reaches the Hugging Face Hub (a model outside the catalog is fetched from a local stand-in:
# tests/models/test_hub.py). Set before huggingface_hub loads.
os.environ["HF_HUB_OFFLINE"] = "1"
# Nor the user's Hugging Face cache: a dataset there would be counted (tunecost.workload.job_data). Tests that need
# one make their own (`hub_cache`); this path is never created.
os.environ["HF_HUB_CACHE"] = os.path.join(tempfile.gettempdir(), f"tunecost-tests-no-hf-cache-{os.getpid()}")
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

FIXTURES_DIR = Path(__file__).parent / "fixtures"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first, then the long ones (when selected): the workers start on them together instead of one
    finishing them alone at the end. Under `--dist loadgroup` (make test) each slow test is handed out alone and the
    other tests of a module go together, so a module's fixtures are made once; a module may name a group of its own
    (`xdist_group`)."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("long") else 2)
    for item in items:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(autouse=True)
def _long_tests_use_every_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A `long` test (CI: end-to-end and training runs, real launches) runs on torch's default of a thread per core, in
    its process and the ones it starts: one thread for every test made CI slower. A count the caller set other than one
    is left alone."""
    mine = os.environ.get("OMP_NUM_THREADS") == "1"
    threads = (os.cpu_count() or 1) if mine and request.node.get_closest_marker("long") is not None else 0
    if threads:
        monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)
    yield
    if threads and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory):
    """The simulation cache of the whole run, in a temporary folder shared by the workers (never the user's)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tunecost-cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TUNECOST_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture
def hub_cache(monkeypatch, tmp_path: Path):
    """`hub_cache(REPO_ID, ROWS)`: a local Hugging Face cache (in tmp_path) holding dataset REPO_ID as one JSON file,
    laid out as `hf download` leaves it; datasets' own cache beside it."""
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")

    def put(repo_id: str, rows: list[dict], file: str = "data.json") -> None:
        repo = tmp_path / "hub" / f"datasets--{repo_id.replace('/', '--')}"
        commit = "0123456789abcdef0123456789abcdef01234567"
        (repo / "snapshots" / commit / file).parent.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
        (repo / "snapshots" / commit / file).write_text(json.dumps(rows), encoding="utf-8")

    return put


# A verbatim copy of the paper artifact's A40 measurements: the points behind the paper's Fig. 14.
PAPER_A40_CSV = FIXTURES_DIR / "measurements" / "measured_throughput_a40.csv"


@pytest.fixture
def paper_a40_csv() -> Path:
    return PAPER_A40_CSV


@pytest.fixture
def config_dir() -> Path:
    """Where `config_path` finds model configs: the tiny configs of real architectures in tests/fixtures/simulate.
    A test folder's conftest.py may override it with a folder of its own."""
    return FIXTURES_DIR / "simulate"


@pytest.fixture
def config_path(config_dir: Path) -> Callable[[str], str]:
    """`config_path(NAME)`: the path of the model config NAME.json in `config_dir`, as a string (what a user types)."""

    def path(name: str) -> str:
        return str(config_dir / f"{name}.json")

    return path


@pytest.fixture
def write_file(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write `text` to tmp_path/name and return the path."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def cli_runner():
    from typer.testing import CliRunner

    return CliRunner()


@pytest.fixture
def cli_error(cli_runner):
    """Run `tunecost ARGS` expecting a user error: exit code 2, exactly one line on stderr
    starting with 'error: ', nothing on stdout, no traceback. Returns that line."""
    from tunecost.cli.main import app

    def run(args: list[str]) -> str:
        result = cli_runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit), result.exception  # not an unhandled error
        assert "Traceback" not in result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: "), lines[0]
        assert result.stdout == ""
        return lines[0]

    return run


def _cli_argv(command: str, options: dict[str, Any]) -> list[str]:
    """`COMMAND` (words split on spaces) followed by keyword options spelled as the CLI spells them:
    `max_new_tokens=3` is `--max-new-tokens 3`, `json=True` the bare flag `--json`, `gradient_checkpointing=False`
    the negative flag `--no-gradient-checkpointing`; any other value is passed as `str(value)`."""
    argv = command.split()
    for name, value in options.items():
        flag = name.replace("_", "-")
        if value is True:
            argv.append(f"--{flag}")
        elif value is False:
            argv.append(f"--no-{flag}")
        else:
            argv += [f"--{flag}", str(value)]
    return argv


@pytest.fixture
def cli_ok(cli_runner):
    """Run `tunecost COMMAND --OPTION VALUE ...` (keyword arguments as options, see `_cli_argv`) expecting
    success: exit code 0 (the output is the assertion's message). Returns the click `Result`."""
    from tunecost.cli.main import app

    def run(command: str, **options: Any):
        result = cli_runner.invoke(app, _cli_argv(command, options))
        assert result.exit_code == 0, result.output
        return result

    return run


@pytest.fixture
def cli_json(cli_ok):
    """Run `tunecost COMMAND --OPTION VALUE ... --json` like `cli_ok` and return the JSON it printed on stdout."""

    def run(command: str, **options: Any):
        return json.loads(cli_ok(command, **options, json=True).stdout)

    return run


@pytest.fixture(scope="session")
def small_mixtral():
    """`small_mixtral(hidden_size, num_attention_heads, **config)`: a tiny Mixtral (fp32, CPU, deterministic for
    `seed`, default 0) whose attention follows from its width: heads of hidden_size / num_attention_heads dimensions,
    two query heads per key-value head. Other config keys (layers, intermediate size, vocabulary, experts) pass
    through to `build_tiny_mixtral`."""
    from tiny_models import gqa_attention

    from tunecost.models.tiny import build_tiny_mixtral

    def build(hidden_size: int, num_attention_heads: int, *, seed: int = 0, **config: Any):
        return build_tiny_mixtral(seed=seed, **gqa_attention(hidden_size, num_attention_heads), **config)

    return build


@pytest.fixture(scope="session")
def one_layer_mixtral(small_mixtral):
    """Builds a one-layer tiny Mixtral (hidden 64, 2 heads, 8 experts; fp32, CPU), deterministic for a seed: small
    enough to train and generate with in a CPU test. Keyword arguments override the config."""

    def build(seed: int = 0, **overrides):
        return small_mixtral(64, 2, seed=seed, **{"num_hidden_layers": 1, "intermediate_size": 128, **overrides})

    return build
