"""A hub id outside the catalog and the cache: its config.json fetched by huggingface_hub from a local stand-in for
the Hub (HF_ENDPOINT), in a fresh process; what the Hub answers for a missing, gated or unreachable repository,
and HF_HUB_OFFLINE, each one `error:` line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

CONFIG = json.loads((Path(__file__).parents[1] / "fixtures" / "simulate" / "tiny-mixtral-2l.json").read_text())
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class _Hub(BaseHTTPRequestHandler):
    """`/ORG/NAME/resolve/main/config.json`: the config for tiny-org/*, 404 RepoNotFound for missing-org/*, 403
    GatedRepo for gated-org/*, 404 EntryNotFound for any other file."""

    def _answer(self, body: bool) -> None:
        parts = self.path.lstrip("/").split("/")
        org, filename = parts[0], parts[-1]
        status, headers, payload = 200, {}, json.dumps(CONFIG).encode()
        if org == "missing-org":
            status, headers = 404, {"X-Error-Code": "RepoNotFound"}
        elif org == "gated-org":
            status, headers = 403, {"X-Error-Code": "GatedRepo"}
        elif filename != "config.json":
            status, headers = 404, {"X-Error-Code": "EntryNotFound"}
        if status != 200:
            payload = json.dumps({"error": headers["X-Error-Code"]}).encode()
        else:
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(payload).hexdigest()}"'}
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(payload))}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _resolve(hub: str, home: Path, name: str, offline: bool = False) -> subprocess.CompletedProcess[str]:
    """`resolve_model(name)` in a fresh process against the stand-in Hub, with its own HF cache in `home`."""
    env = {**os.environ, "HF_ENDPOINT": hub, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1" if offline else "0"}
    env.pop("HF_TOKEN", None)
    env.pop("HF_HUB_CACHE", None)  # the cache under HF_HOME
    code = (
        "import sys\nfrom tunecost.errors import TunecostError\nfrom tunecost.models.catalog import resolve_model\n"
        f"try:\n    spec = resolve_model({name!r})\nexcept TunecostError as exc:\n    sys.exit(f'error: {{exc}}')\n"
        "print(spec.name, spec.hub_id, spec.config['num_hidden_layers'], spec.config['num_local_experts'])"
    )
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_a_hub_id_outside_the_catalog_is_read_from_its_downloaded_config(hub, tmp_path) -> None:
    done = _resolve(hub, tmp_path, "tiny-org/tiny-mixtral")
    assert done.returncode == 0, done.stderr
    layers, experts = CONFIG["num_hidden_layers"], CONFIG["num_local_experts"]
    assert done.stdout.split() == ["tiny-org/tiny-mixtral", "tiny-org/tiny-mixtral", str(layers), str(experts)]
    cached = list((tmp_path / "hub").rglob("config.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text()) == CONFIG  # in the HF cache, as the Hub gave it
    again = _resolve(hub, tmp_path, "tiny-org/tiny-mixtral", offline=True)  # the cached copy, without the Hub
    assert again.returncode == 0 and again.stdout == done.stdout, again.stderr


@pytest.mark.parametrize(
    ("name", "offline", "message"),
    [
        ("missing-org/model", False, "no such repository on the Hub"),
        ("gated-org/model", False, "the repository is gated; accept its terms on the Hub"),
        ("tiny-org/other", True, "is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"),
    ],
)
def test_what_the_hub_answers_is_one_error_line(hub, tmp_path, name, offline, message) -> None:
    done = _resolve(hub, tmp_path, name, offline=offline)
    assert done.returncode == 1 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: model {name!r} is not in the catalog: config.json of {name!r}") and message in line


def test_an_unreachable_hub_is_one_error_line(tmp_path) -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)  # bound, then closed: nothing listens on the port
    port = closed.server_address[1]
    closed.server_close()
    done = _resolve(f"http://127.0.0.1:{port}", tmp_path, "tiny-org/tiny-mixtral")
    (line,) = done.stderr.splitlines()
    assert "the Hub could not be reached" in line and "HF_HUB_OFFLINE=1" in line
