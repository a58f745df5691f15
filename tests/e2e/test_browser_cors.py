"""CORS from a real browser (issue 36): Debian's headless Chromium loads a
page from another origin (a second loopback port) whose script calls
`ingot serve`: a simple GET, and a JSON POST with an API key that needs a
preflight. With the page's origin allowed both succeed and the script reads
the exposed `x-request-id`; from an origin not on the list the browser
blocks both (the server answered, the page gets a network error)."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

KEY = "sk-browser-test"

# The page reports into <pre id="out"> as JSON, which --dump-dom prints.
PAGE = """<!doctype html>
<html><body><pre id="out">pending</pre>
<script>
const api = "%(api)s";
async function attempt(f) {
  try { return await f(); } catch (e) { return {blocked: String(e)}; }
}
(async () => {
  const models = await attempt(async () => {
    const r = await fetch(api + "/v1/models", {headers: {"Authorization": "Bearer %(key)s"}});
    return {status: r.status, ids: (await r.json()).data.map(m => m.id)};
  });
  const chat = await attempt(async () => {
    const r = await fetch(api + "/v1/chat/completions", {
      method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer %(key)s"},
      body: JSON.stringify({model: "%(model)s", messages: [{role: "user", content: "Hi"}], max_tokens: 4,
                            temperature: 0}),
    });
    const body = await r.json();
    return {status: r.status, request_id: r.headers.get("x-request-id"),
            text: body.choices ? body.choices[0].message.content : null};
  });
  document.getElementById("out").textContent = JSON.stringify({models, chat});
})();
</script></body></html>
"""


def browser() -> str:
    for name in ("chromium-headless-shell", "chromium"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError("no headless Chromium on PATH")


class Page:
    """A page origin: `html` at `/` on its own loopback port."""

    def __init__(self):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PageHandler)
        self.httpd.html = b""
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def serve(self, html: str) -> None:
        self.httpd.html = html.encode()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _PageHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        html = self.server.html
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(html)))
        self.end_headers()
        self.wfile.write(html)

    def log_message(self, *args):
        pass


def visit(origin_page: Page) -> dict:
    """Loads the page in headless Chromium until its script has reported;
    returns the report."""
    out = subprocess.run(
        [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--virtual-time-budget=30000", "--dump-dom", origin_page.origin + "/"],
        capture_output=True, text=True, timeout=120,
    )
    m = re.search(r'<pre id="out">(.*?)</pre>', out.stdout, re.S)
    assert m, f"no report in the page (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    text = m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    assert text != "pending", f"the script did not finish:\n{out.stderr[-2000:]}"
    return json.loads(text)


@pytest.mark.needs("chromium-headless-shell", reason="the browser of the CORS test (scripts/system-packages)")
def test_a_browser_on_an_allowed_origin_calls_the_api_and_others_are_blocked(server_factory, model_name,
                                                                             tmp_path: Path):
    allowed_page, other_page = Page(), Page()
    try:
        cfg = tmp_path / "cors.toml"
        cfg.write_text(f'[server]\ncors_allowed_origins = ["{allowed_page.origin}"]\n')
        srv = server_factory("--config", str(cfg), "--api-key", KEY)
        html = PAGE % {"api": srv.url, "key": KEY, "model": model_name}
        for page in (allowed_page, other_page):
            page.serve(html)

        report = visit(allowed_page)
        assert report["models"]["status"] == 200, report
        assert report["models"]["ids"], report
        chat = report["chat"]
        assert chat["status"] == 200 and chat["text"], report
        assert chat["request_id"], f"x-request-id is exposed to the page: {report}"

        report = visit(other_page)
        assert "blocked" in report["models"] and "blocked" in report["chat"], report
        # The server itself is fine: the browser kept the answers from the page.
        with srv.http() as http:
            r = http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}", "Origin": other_page.origin})
            assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    finally:
        allowed_page.close()
        other_page.close()
