"""Fuzzing the embedded hub's HTTP surface with hypothesis: methods, paths (every route, with
hostile segments and percent-escapes), query strings, headers (tokens, content types, ranges) and
bodies (bytes, forms, JSON, NDJSON), sent as raw HTTP to one server for the module.

Properties, for every request:
- the answer is a complete HTTP response with a status below 500 (malformed input is the
  client's fault: 4xx), and an error answer carries a JSON ``error`` (but Starlette's own
  plain-text answers to a malformed or unsatisfiable Range);
- the server still answers: ``whoami`` works after each request.

Determinism: ``derandomize=True`` and no example database, as in ``test_fuzz.py``. Size: 250
requests, about 5-10 s on a busy 2-core machine (slow tests run in the default suite, so there is
no slow variant); ``MODELPATCH_HUB_FUZZ_EXAMPLES=2000`` runs more (about a minute).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
from urllib.parse import quote

import pytest
from hub_fixtures import running_hub
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patcher.hub.store.commit_ops import Op
from patcher.hub.store.git_objects import regular_entry
from patcher.hub.store.storage import Store

EXAMPLES = int(os.environ.get("MODELPATCH_HUB_FUZZ_EXAMPLES", "250"))
TOKENS = {"write-alice": {"user": "alice", "write": True},
          "sha256:" + hashlib.sha256(b"hashed").hexdigest(): {"user": "ci"}}


def fuzz_settings(n: int):
    return settings(max_examples=n, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much,
                                           HealthCheck.function_scoped_fixture])


_SAMPLE = os.urandom(20_000) + bytes(20_000)
_BUILT: dict = {}


def _built() -> dict:
    if not _BUILT:
        from xet_clients import built_upload

        _BUILT.update(built_upload(_SAMPLE))
    return _BUILT


_XORB_HEX = "{xorb}"
_FILE_HEX = "{file}"


def _mangled(which: bytes, junk: bytes, at: int) -> bytes:
    data = _built()["xorb" if which == b"XORB" else "shard"]
    return data[:at] + junk + data[at + len(junk):]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-hub")
    store = Store(root)
    for repo, private in (("alice/public", False), ("alice/private", True)):
        meta = store.create_repo("model", repo, private=private, author="alice")
        ops = [Op("add", path, regular_entry(store.put_bytes(data), data)) for path, data in
               (("config.json", b"{}"), ("dir/a.txt", b"a" * 100), ("dir/sub/b.bin", b"\0" * 9))]
        store.commit(meta, "main", ops, message="files", description="", author="alice")
    with running_hub(root, TOKENS) as running:
        from xet_clients import call, xet_token

        built = _built()
        tokens = {"XET-WRITE": xet_token(running.endpoint, "alice/public", "write-alice", True),
                  "XET-READ": xet_token(running.endpoint, "alice/private", "write-alice")}
        call(running.endpoint, "POST", f"/cas/v1/xorbs/default/{built['xorb_hex']}",
             token=tokens["XET-WRITE"], body=built["xorb"])
        call(running.endpoint, "POST", "/cas/v1/shards", token=tokens["XET-WRITE"],
             body=built["shard"])
        XET_TOKENS.update(tokens)
        host, port = running.endpoint.removeprefix("http://").split(":")
        yield host, int(port)


# -- strategies ----------------------------------------------------------------------------------

HOSTILE_TEXT = st.sampled_from(["main", "main", "refs/heads/main", "dir", "dir/a.txt", "..",
                                ".", ".git", "a\nb", "\0", "%", "%00", "%2F", "%ff%fe", "a" * 300,
                                "\u202e", "a b", "0" * 40, "?x=1", "#f", "\\", "~", ""])
SEGMENT = st.one_of(
    HOSTILE_TEXT.map(lambda s: quote(s, safe="%")),
    st.text(max_size=20).map(lambda s: quote(s, safe="")),
    st.from_regex(r"[A-Za-z0-9._%-]{0,12}", fullmatch=True),
)
# Mostly the repos that exist (so requests get past the access checks), sometimes anything.
REPO = st.one_of(st.sampled_from(["alice/public", "alice/private", "alice/public",
                                  "alice/private", "alice/new", "bob/x"]),
                 st.tuples(SEGMENT, SEGMENT).map("/".join))
# (method, path template) of every route; {k}: models/datasets, {r}: a repo, {s}: a segment.
ROUTES = [
    ("GET", "/api/whoami-v2"), ("POST", "/api/repos/create"), ("DELETE", "/api/repos/delete"),
    ("POST", "/api/validate-yaml"), ("GET", "/api/{k}/{r}"), ("GET", "/api/{k}/{r}/revision/{s}"),
    ("GET", "/api/{k}/{r}/tree/{s}"), ("GET", "/api/{k}/{r}/tree/{s}/{s}"),
    ("POST", "/api/{k}/{r}/paths-info/{s}"), ("GET", "/api/{k}/{r}/refs"),
    ("GET", "/api/{k}/{r}/commits/{s}"), ("POST", "/api/{k}/{r}/branch/{s}"),
    ("DELETE", "/api/{k}/{r}/branch/{s}"), ("POST", "/api/{k}/{r}/tag/{s}"),
    ("DELETE", "/api/{k}/{r}/tag/{s}"), ("PUT", "/api/{k}/{r}/settings"),
    ("POST", "/api/{k}/{r}/preupload/{s}"), ("POST", "/api/{k}/{r}/commit/{s}"),
    ("POST", "/api/{k}/{r}/xet-write-token/{s}"), ("POST", "/{r}.git/info/lfs/objects/batch"),
    ("PUT", "/{r}.git/info/lfs/objects/upload/{s}/{s}"),
    ("POST", "/{r}.git/info/lfs/objects/verify"), ("GET", "/{r}/resolve/{s}/{s}"),
    ("HEAD", "/{r}/resolve/main/{s}"), ("GET", "/{r}/resolve/main/dir/a.txt"), ("GET", "/{s}"),
    ("GET", "/{s}/{s}/{s}"),
    # the Xet side: token routes and the CAS API ({x}: a Xet hash, or anything)
    ("GET", "/api/{k}/{r}/xet-read-token/{s}"), ("GET", "/api/{k}/{r}/xet-write-token/{s}"),
    ("POST", "/cas/v1/xorbs/default/{x}"), ("HEAD", "/cas/v1/xorbs/default/{x}"),
    ("POST", "/cas/v1/shards"), ("POST", "/cas/v2/shards"), ("GET", "/cas/v1/chunks/default/{x}"),
    ("HEAD", "/cas/v1/files/{x}"), ("GET", "/cas/v1/reconstructions/{x}"),
    ("GET", "/cas/v2/reconstructions/{x}"), ("POST", "/cas/v1/reconstructions"),
    ("GET", "/cas/xorbs/{x}"),
]
OTHER_METHODS = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS",
                                 "TRACE", "FOO"])


@st.composite
def requests(draw) -> tuple[str, str]:
    """(method, path): mostly a route's own method, sometimes another one."""
    method, template = draw(st.sampled_from(ROUTES))
    if draw(st.integers(0, 9)) == 0:
        method = draw(OTHER_METHODS)
    kinds = draw(st.sampled_from(["models", "models", "datasets", "spaces"]))
    out = template.replace("{k}", kinds).replace("{r}", draw(REPO))
    while "{x}" in out:
        out = out.replace("{x}", draw(st.one_of(st.sampled_from([_XORB_HEX, _FILE_HEX, "0" * 64]),
                                                SEGMENT)), 1)
    while "{s}" in out:
        out = out.replace("{s}", draw(SEGMENT), 1)
    query = draw(st.one_of(st.just(""), st.sampled_from(
        ["?recursive=true&expand=true", "?blobs=true", "?cursor=-1", "?cursor=x&limit=0",
         "?limit=99999999999999999999", "?create_pr=1", "?expires=1&sig=00",
         "?r=0-10&e=99999999999&s=00", "?r=5-1&e=x&s="]),
        st.text(max_size=20).map(lambda s: "?" + quote(s, safe="=&"))))
    return method, out + query


JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                              st.text(max_size=10)),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(st.text(max_size=8), inner,
                                                            max_size=4)),
                    max_leaves=12)
PAYLOAD_KEYS = st.sampled_from(["name", "type", "organization", "private", "visibility",
                                "files", "objects", "operation", "transfers", "oid", "size",
                                "paths", "expand", "tag", "startingPoint", "gated", "content"])
PAYLOAD = st.dictionaries(PAYLOAD_KEYS, JSON, max_size=5)
COMMIT_LINE = st.fixed_dictionaries({"key": st.sampled_from(["header", "file", "lfsFile",
                                                            "deletedFile", "deletedFolder", "x"]),
                                     "value": st.dictionaries(st.sampled_from(
                                         ["path", "content", "encoding", "oid", "size", "algo",
                                          "summary", "parentCommit"]), JSON, max_size=4)})
BODY = st.one_of(
    PAYLOAD.map(lambda v: json.dumps(v).encode()),
    st.just(b""),
    st.binary(max_size=200),
    JSON.map(lambda v: json.dumps(v).encode()),
    PAYLOAD.map(lambda v: json.dumps(v).encode()),
    st.lists(COMMIT_LINE, max_size=4).map(
        lambda lines: "\n".join(json.dumps(x) for x in lines).encode()),
    st.lists(st.text(max_size=12), max_size=6).map(
        lambda xs: "&".join("paths=" + quote(x) for x in xs).encode()),
    st.sampled_from([b"[" * 5000, b"{" * 5000, b'{"a":' * 3000, b"\xff\xfe", b"\0" * 10]),
    # xorbs and shards, whole or mangled
    st.tuples(st.sampled_from([b"XORB", b"SHARD"]), st.binary(max_size=8),
              st.integers(0, 400)).map(lambda t: _mangled(*t)),
)
HEADERS = st.fixed_dictionaries({}, optional={
    "Authorization": st.sampled_from(["Bearer XET-WRITE", "Bearer XET-READ", "Bearer XET-WRITE",
                                      "Bearer write-alice", "Bearer write-alice",
                                      "Bearer write-alice", "Bearer hashed", "Bearer nope",
                                      "Bearer " + next(iter(TOKENS.keys() - {"write-alice"})),
                                      "Basic eDp5", "Bearer", "bearer  write-alice "]),
    "Content-Type": st.sampled_from(["application/json", "application/x-www-form-urlencoded",
                                     "application/x-ndjson", "text/plain; charset=\u00e9",
                                     "multipart/form-data; boundary=x"]),
    "Range": st.sampled_from(["bytes=0-0", "bytes=-1", "bytes=5-2", "bytes=0-99999999999",
                              "bytes=x", "bytes=0-1,3-4", "items=0-1", "bytes=" + "0-1," * 200]),
    "X-Forwarded-Proto": st.sampled_from(["https", "\u00e9", ""]),
    "If-None-Match": st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
})

# -- the requests --------------------------------------------------------------------------------


XET_TOKENS: dict[str, str] = {}


def send(server, method: str, path: str, headers: dict[str, str], body: bytes
         ) -> tuple[int, str, bytes]:
    """One request on a fresh connection; the status, content type and body of the complete
    answer. ``XET-WRITE`` / ``XET-READ`` in a header or the path stand for the Xet tokens of the
    module's hub, ``{xorb}`` / ``{file}`` for its xorb and file hashes."""
    built = _built()
    for name, token in XET_TOKENS.items():
        headers = {k: v.replace(name, token) for k, v in headers.items()}
    path = path.replace("%7Bxorb%7D", built["xorb_hex"]).replace("{xorb}", built["xorb_hex"])
    path = path.replace("%7Bfile%7D", built["file_hex"]).replace("{file}", built["file_hex"])
    conn = http.client.HTTPConnection(*server, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=False, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value.encode("latin-1", "replace"))
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.getheader("content-type", ""), response.read()
    finally:
        conn.close()


def check_request(server, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
    try:
        status, content_type, answer = send(server, method, path, headers, body)
    except (http.client.RemoteDisconnected, ConnectionResetError, socket.timeout) as exc:
        raise AssertionError(f"no answer to {method} {path!r}: {exc!r}") from None
    assert status < 500, (method, path, headers, body[:200], status, answer[:300])
    if status >= 400 and method != "HEAD" and content_type != "text/plain; charset=utf-8":
        assert "error" in json.loads(answer), answer[:300]
    status, _, answer = send(server, "GET", "/api/whoami-v2",
                             {"Authorization": "Bearer write-alice"}, b"")
    assert status == 200 and json.loads(answer)["name"] == "alice"


@fuzz_settings(EXAMPLES)
@given(request=requests(), headers=HEADERS, body=BODY)
def test_no_request_gets_a_5xx_or_stops_the_hub(server, request, headers, body):
    check_request(server, *request, headers, body)

