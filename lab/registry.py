"""A tiny read-only Docker Registry (HTTP API v2) for the lab, stdlib only.

Serves what lab/image.py writes under ROOT:
  ROOT/blobs/sha256:<hex>                  config and layer blobs
  ROOT/manifests/<name>/<tag or digest>    schema2 manifests
Run: python3 lab/registry.py --listen 203.0.113.1:5000 --root DIR
"""

from __future__ import annotations

import argparse
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST_RE = re.compile(r"^/v2/(?P<name>[a-z0-9._/-]+)/manifests/(?P<ref>[A-Za-z0-9._:-]+)$")
BLOB_RE = re.compile(r"^/v2/(?P<name>[a-z0-9._/-]+)/blobs/(?P<digest>sha256:[0-9a-f]{64})$")
SCHEMA2 = "application/vnd.docker.distribution.manifest.v2+json"


class Handler(BaseHTTPRequestHandler):
    root: Path
    protocol_version = "HTTP/1.1"

    def _json(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        self._json(
            status, json.dumps({"errors": [{"code": code, "message": code.lower()}]}).encode()
        )

    def _file(self, path: Path, ctype: str, digest: str) -> None:
        size = path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(size))
        self.send_header("Docker-Content-Digest", digest)
        self.send_header("ETag", f'"{digest}"')
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                self.wfile.write(chunk)

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        path = self.path.split("?", 1)[0]
        if path in ("/v2", "/v2/"):
            self._json(200, b"{}")
            return
        if m := MANIFEST_RE.match(path):
            f = self.root / "manifests" / m["name"] / m["ref"]
            if not f.is_file():
                return self._error(404, "MANIFEST_UNKNOWN")
            digest_file = f.with_name(f.name + ".digest")
            digest = digest_file.read_text().strip() if digest_file.exists() else m["ref"]
            ctype = json.loads(f.read_text()).get("mediaType", SCHEMA2)
            return self._file(f, ctype, digest)
        if m := BLOB_RE.match(path):
            f = self.root / "blobs" / m["digest"]
            if not f.is_file():
                return self._error(404, "BLOB_UNKNOWN")
            return self._file(f, "application/octet-stream", m["digest"])
        self._error(404, "NAME_UNKNOWN")

    do_HEAD = do_GET  # noqa: N815

    def _refuse(self) -> None:
        self._error(405, "UNSUPPORTED")

    do_POST = do_PUT = do_PATCH = do_DELETE = _refuse  # noqa: N815


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--listen", default="127.0.0.1:5000", help="ADDR:PORT")
    ap.add_argument("--root", required=True, type=Path)
    args = ap.parse_args()
    host, port = args.listen.rsplit(":", 1)
    Handler.root = args.root
    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    print(f"registry on {args.listen} serving {args.root}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
