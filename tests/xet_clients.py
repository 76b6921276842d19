"""Stock huggingface_hub (+ hf_xet) clients in subprocesses, for the embedded hub's Xet tests.

huggingface_hub reads ``HF_HUB_DISABLE_XET`` once, at import, and the test process has imported
it with Xet disabled (``hub_fixtures``); so each client runs in a fresh interpreter whose
environment has no ``HF_*`` variable of ours: DEFAULT settings (Xet on), or ``HF_HUB_DISABLE_XET=1``
for the LFS mode. One subprocess runs a list of operations and reports each one's result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_CLIENT = r'''
import hashlib, json, os, sys
from huggingface_hub import (CommitOperationCopy, HfApi, constants, hf_hub_download,
                             snapshot_download)

endpoint, ops = sys.argv[1], json.loads(sys.argv[2])
out = {"xet_disabled": constants.HF_HUB_DISABLE_XET, "results": []}

def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()

for op in ops:
    name, token, args = op[0], op[1], op[2:]
    api = HfApi(endpoint=endpoint, token=token)
    try:
        if name == "create":
            api.create_repo(args[0], private=args[1], exist_ok=True)
            result = None
        elif name == "upload_folder":
            result = api.upload_folder(repo_id=args[0], folder_path=args[1]).oid
        elif name == "snapshot":
            path = snapshot_download(args[0], endpoint=endpoint, token=token, cache_dir=args[1])
            result = {f: sha(os.path.join(path, f)) for f in sorted(os.listdir(path))}
        elif name == "download":
            result = sha(hf_hub_download(args[0], args[1], endpoint=endpoint, token=token,
                                         cache_dir=args[2]))
        elif name == "copy":
            src, src_path, dst, dst_path = args
            result = api.create_commit(dst, operations=[CommitOperationCopy(
                src_path_in_repo=src_path, path_in_repo=dst_path, src_repo_id=src,
                src_repo_type="model")],
                commit_message="copy").oid
        else:
            raise ValueError(name)
        out["results"].append({"ok": result})
    except Exception as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        out["results"].append({"error": type(exc).__name__, "status": status,
                               "message": str(exc)[:500]})
print("RESULT " + json.dumps(out))
'''


def run_client(endpoint: str, ops: list[list[Any]], home: Path, *, xet: bool = True,
               timeout: float = 240) -> list[dict[str, Any]]:
    """Run ``ops`` (``[name, token, *args]``) in one stock client; each op's ``{"ok": ...}`` or
    ``{"error", "status", "message"}``. ``xet=False``: the client has HF_HUB_DISABLE_XET=1."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGING_FACE_")) and k != "TRANSFORMERS_OFFLINE"}
    env["HF_HOME"] = str(home)
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if not xet:
        env["HF_HUB_DISABLE_XET"] = "1"
    proc = subprocess.run([sys.executable, "-c", _CLIENT, endpoint, json.dumps(ops)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    report = json.loads(lines[-1][len("RESULT "):])
    assert report["xet_disabled"] is (not xet)
    return report["results"]


# -- a hand-built client: the CAS API driven request by request ---------------------------------


def call(endpoint: str, method: str, path: str, *, token: str | None = None, body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request to the hub (``path`` may be a full URL); status, headers, body."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(path if "://" in path else endpoint + path)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.putrequest(method, url.path + (f"?{url.query}" if url.query else ""))
        for name, value in {**(headers or {}),
                            **({"Authorization": f"Bearer {token}"} if token else {})}.items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def xet_token(endpoint: str, repo: str, hub_token: str | None, write: bool = False) -> str:
    status, _, body = call(endpoint, "GET", f"/api/models/{repo}/xet-"
                           f"{'write' if write else 'read'}-token/main", token=hub_token)
    assert status == 200, body
    return json.loads(body)["accessToken"]


def built_upload(data: bytes) -> dict[str, Any]:
    """``data`` as a client would send it: its chunks, one xorb, a shard of one file."""
    import hashlib

    from patcher.hub.xet import chunking, hashing, shard, xorb

    chunks = chunking.chunk_bytes(data)
    hashes = [hashing.chunk_hash(c) for c in chunks]
    pairs = [(h, len(c)) for h, c in zip(hashes, chunks)]
    xorb_raw = hashing.xorb_hash(pairs)
    info = shard.FileInfo(hashing.file_hash(pairs),
                          (shard.FileTerm(xorb_raw, len(data), 0, len(chunks)),),
                          (hashing.verification_hash(hashes),),
                          hashing.hex_to_hash(hashlib.sha256(data).hexdigest()))
    return {"chunks": chunks, "hashes": hashes, "xorb": xorb.serialize_xorb(chunks),
            "xorb_hex": hashing.hash_to_hex(xorb_raw), "info": info,
            "file_hex": hashing.hash_to_hex(info.file_hash),
            "shard": shard.serialize_shard(shard.Shard([info], [])),
            "sha256": hashlib.sha256(data).hexdigest()}


def rebuild(endpoint: str, answer: dict[str, Any]) -> bytes:
    """The bytes a reconstruction answer (v1 or v2) describes, fetched from its URLs."""
    from patcher.hub.xet import xorb

    chunks: dict[tuple[str, int], bytes] = {}
    for xorb_hex, entries in (answer.get("xorbs") or answer.get("fetch_info")).items():
        for entry in entries:
            ranges = entry.get("ranges") or [{"chunks": entry["range"],
                                              "bytes": entry["url_range"]}]
            for r in ranges:
                status, _, data = call(endpoint, "GET", entry["url"], headers={
                    "Range": f"bytes={r['bytes']['start']}-{r['bytes']['end']}"})
                assert status == 206, data
                for i, (_, raw) in enumerate(xorb.iter_xorb(data, 1 << 20)):
                    chunks[(xorb_hex, r["chunks"]["start"] + i)] = raw
    out = b"".join(chunks[(t["hash"], i)] for t in answer["terms"]
                   for i in range(t["range"]["start"], t["range"]["end"]))
    return out[answer["offset_into_first_range"]:]
