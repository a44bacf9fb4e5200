"""Serving the web UI's files (hutch.mgmt.ui): no browser needed, so these always run."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import ServerInfo  # tests/conftest.py (tests/ is on sys.path)
from hutch.mgmt import ui


def fetch(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_every_file_in_the_package_is_served_with_its_type(hutch_server: ServerInfo) -> None:
    files = ui.load_files()
    assert {"index.html", "app.js", "app.css"} <= set(files)
    for name, f in files.items():
        status, headers, body = fetch(f"{hutch_server.mgmt_url}/ui/{name}")
        assert status == 200, name
        assert body == f.body
        assert headers["Content-Type"] == f.content_type
        assert headers["Cache-Control"] == "no-cache"
        assert headers["ETag"] == f.etag
        assert headers["X-Content-Type-Options"] == "nosniff"
    assert files["app.js"].content_type.startswith("text/javascript")
    assert files["app.css"].content_type.startswith("text/css")


def test_index_at_root_needs_no_login_and_loads_the_app(hutch_server: ServerInfo) -> None:
    status, headers, body = fetch(hutch_server.mgmt_url + "/")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert b'<script type="module" src="/ui/app.js">' in body
    status, headers, body = fetch(hutch_server.mgmt_url + "/", method="HEAD")
    assert status == 200 and body == b""


def test_revalidation_answers_304(hutch_server: ServerInfo) -> None:
    status, headers, _ = fetch(hutch_server.mgmt_url + "/ui/app.css")
    status, again, body = fetch(hutch_server.mgmt_url + "/ui/app.css", headers={"If-None-Match": headers["ETag"]})
    assert status == 304 and body == b"" and again["ETag"] == headers["ETag"]
    status, _, _ = fetch(hutch_server.mgmt_url + "/ui/app.css", headers={"If-None-Match": '"stale"'})
    assert status == 200


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/", "/ui/..%2Fui.py", "/ui/%2e%2e%2fhttp.py", "/ui/.hidden"])
def test_only_the_ui_files_are_served(hutch_server: ServerInfo, path: str) -> None:
    status, headers, body = fetch(hutch_server.mgmt_url + path)
    assert status == 404
    assert json.loads(body) == {"error": "Object Not Found", "reason": "Not Found"}


def test_a_missing_directory_serves_nothing(tmp_path: Path) -> None:
    assert ui.load_files(tmp_path / "absent") == {}
    (tmp_path / "a.js").write_text("x")
    (tmp_path / ".swp").write_text("y")
    assert set(ui.load_files(tmp_path)) == {"a.js"}
