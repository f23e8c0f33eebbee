"""A stand-in package registry for the network tests (crates/txbox/tests/network.rs): one HTTP
server on a loopback address that serves a tiny package to pip (a PEP 503 simple index and a
wheel), to npm (a packument and a tarball), to cargo (a sparse index and a .crate), and the
files of a directory (a git repository over dumb HTTP).

usage: python3 standin_registry.py HOST DIR    prints the port, then serves until killed
"""
import base64
import hashlib
import http.server
import io
import json
import sys
import tarfile
import zipfile

HOST, ROOT = sys.argv[1], sys.argv[2]
NAME = "txbox-probe"
FILES = {}


def tar_gz(members):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 1700000000
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def wheel():
    files = {
        "txbox_probe/__init__.py": b"VALUE = 42\n",
        "txbox_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: txbox-probe\nVersion: 1.0\n",
        "txbox_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: standin\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    record += "txbox_probe-1.0.dist-info/RECORD,,\n"
    files["txbox_probe-1.0.dist-info/RECORD"] = record.encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return out.getvalue()


def build(base):
    whl = wheel()
    whl_name = "txbox_probe-1.0-py3-none-any.whl"
    FILES[f"/files/{whl_name}"] = (whl, "application/octet-stream")
    sha = hashlib.sha256(whl).hexdigest()
    FILES[f"/simple/{NAME}/"] = (
        f'<html><body><a href="{base}/files/{whl_name}#sha256={sha}">{whl_name}</a></body></html>'.encode(),
        "text/html",
    )
    FILES["/simple/"] = (f'<html><body><a href="/simple/{NAME}/">{NAME}</a></body></html>'.encode(), "text/html")

    tgz = tar_gz({
        "package/package.json": json.dumps({"name": NAME, "version": "1.0.0", "main": "index.js"}).encode(),
        "package/index.js": b"module.exports = 42;\n",
    })
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
    FILES[f"/npm/{NAME}/-/{NAME}-1.0.0.tgz"] = (tgz, "application/octet-stream")
    FILES[f"/npm/{NAME}"] = (json.dumps({
        "name": NAME,
        "dist-tags": {"latest": "1.0.0"},
        "versions": {"1.0.0": {
            "name": NAME, "version": "1.0.0",
            "dist": {"tarball": f"{base}/npm/{NAME}/-/{NAME}-1.0.0.tgz",
                     "shasum": hashlib.sha1(tgz).hexdigest(), "integrity": integrity},
        }},
    }).encode(), "application/json")

    crate = tar_gz({
        f"{NAME}-1.0.0/Cargo.toml": (f'[package]\nname = "{NAME}"\nversion = "1.0.0"\nedition = "2021"\n'
                                      '\n[lib]\npath = "src/lib.rs"\n').encode(),
        f"{NAME}-1.0.0/src/lib.rs": b"pub const VALUE: u32 = 42;\n",
    })
    FILES[f"/cargo/dl/{NAME}/1.0.0"] = (crate, "application/octet-stream")
    FILES["/cargo/config.json"] = (json.dumps({"dl": f"{base}/cargo/dl/{{crate}}/{{version}}"}).encode(),
                                   "application/json")
    line = {"name": NAME, "vers": "1.0.0", "deps": [], "cksum": hashlib.sha256(crate).hexdigest(),
            "features": {}, "yanked": False}
    FILES[f"/cargo/{NAME[:2]}/{NAME[2:4]}/{NAME}"] = (json.dumps(line).encode() + b"\n", "text/plain")


class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory=ROOT, **k)

    def log_message(self, *a):
        pass

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path in FILES:
            data, kind = FILES[path]
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if path.startswith(("/simple/", "/npm/", "/cargo/", "/files/")):
            self.send_error(404)
            return
        super().do_GET()


server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
build(f"http://{HOST}:{server.server_address[1]}")
print(server.server_address[1], flush=True)
server.serve_forever()
