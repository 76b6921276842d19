"""``RemoteModel``: a ``ModelDir`` of a hub repository, read without its tensor data.

``RemoteModel.open("hf://org/name[@rev]")`` lists the repository at one commit, fetches each
safetensors header (its 8-byte length, then the header, by HTTP Range requests, in parallel and
bounded) and the shard index, and validates them exactly as a local directory's: the same strict
header parser and the same index checks, so a hostile hub gets the same one-line errors. Other
files (config.json and the rest) are fetched whole when first read. Tensor data is never fetched.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import PosixPath

from .. import collector
from ..errors import ModelDirError
from ..model.model_dir import (
    BASE_RECORD,
    INDEX_NAME,
    SKIPPED_DIRS,
    ModelDir,
    ModelFile,
    parse_index,
)
from ..model.safetensors_io import SafetensorsFormatError, header_length, parse_header
from ..model_ref import HF_SCHEME
from ..model_ref import is_hub as is_remote  # noqa: F401  (the name callers know)
from .hub_files import HubFiles, parse_hf_url

#: Header fetches in flight at once (each is two small requests).
MAX_PARALLEL_FETCHES = 16
#: The largest non-shard file fetched whole (tokenizer.json is ~10 MB at most; a hub listing a
#: multi-gigabyte "config.json" is refused, not read).
MAX_FETCHED_FILE = 64 * 1024 * 1024
#: Small JSON files every command reads, fetched along with the headers.
PREFETCHED = ("config.json", "hf_quant_config.json", "generation_config.json",
              "tokenizer_config.json")


class HubRoot(PosixPath):
    """The root of a remote model; printed as ``hf://org/name[@rev]`` (paths under it too).

    It is never a local path: ``open``, ``os.stat`` and every other filesystem call refuse it
    in one line, so no code path can read ``./hf:/org/name/...`` of the current directory in
    the hub's place (its files' bytes come only from ``RemoteModel.read_bytes``)."""

    def __str__(self) -> str:
        text = super().__str__()
        return HF_SCHEME + text[len("hf:/"):] if text.startswith("hf:/") else text

    def __fspath__(self) -> str:
        raise ModelDirError("is a file of a hub repository, not of this machine: only its JSON "
                            "files and safetensors headers are read for an hf:// model",
                            where=str(self), hint="download it first: apply hf://... does")


class RemoteModel(ModelDir):
    """A validated, read-only view of a hub repository; ``hub.transfer`` counts what it cost."""

    hub: HubFiles
    _fetched: dict[str, bytes]

    @classmethod
    def open(cls, url: str,  # type: ignore[override]
             endpoint: str | None = None, what: str = "inspect") -> "RemoteModel":
        """``what``: the command its hub errors name."""
        repo_id, revision = parse_hf_url(url)
        hub = HubFiles(repo_id, revision, endpoint, what=what)
        root = HubRoot("hf:/" + repo_id + (f"@{revision}" if revision else ""))
        files = {rel: ModelFile(rel, root / rel, size) for rel, size in sorted(hub.sizes.items())
                 if rel.split("/", 1)[0] not in SKIPPED_DIRS and rel != BASE_RECORD}
        shard_names = [rel for rel in files if rel.endswith(".safetensors")]
        wanted = [rel for rel in (INDEX_NAME, *PREFETCHED) if rel in files]
        with ThreadPoolExecutor(max_workers=MAX_PARALLEL_FETCHES) as pool:
            raw = list(pool.map(lambda rel: _raw_header(hub, root, rel), shard_names))
            fetched = dict(zip(wanted, pool.map(lambda rel: _fetch_whole(hub, root, rel), wanted)))
        with collector.paused():
            shards = {rel: parse_header(root / rel, hub.sizes[rel], header, str(root / rel))
                      for rel, header in zip(shard_names, raw)}
        index = parse_index(fetched[INDEX_NAME], str(root / INDEX_NAME)) \
            if INDEX_NAME in fetched else None
        model = cls(root=root, files=files, shards=shards, index=index)
        model.hub, model._fetched = hub, fetched
        model._check_index()
        return model

    def read_bytes(self, relpath: str) -> bytes:
        if relpath not in self._fetched:
            if relpath.endswith(".safetensors"):
                raise ModelDirError("tensor data of a remote model is not fetched",
                                    where=str(self.root / relpath),
                                    hint="apply hf://... downloads the model")
            self._fetched[relpath] = _fetch_whole(self.hub, self.root, relpath)
        return self._fetched[relpath]

    @property
    def repo_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def transfer_report(self) -> dict:
        """What reading this model cost, against the repository's size (for every command)."""
        t, total = self.hub.transfer, self.repo_bytes
        return {"repo_id": self.hub.repo_id, "commit": self.hub.commit,
                "endpoint": self.hub.endpoint, "requests": t.requests,
                "bytes_transferred": t.bytes, "repo_bytes": total,
                "fraction": t.bytes / total if total else 0.0}


def _fetch_whole(hub: HubFiles, root: HubRoot, rel: str) -> bytes:
    if hub.sizes[rel] > MAX_FETCHED_FILE:
        raise ModelDirError(f"is {hub.sizes[rel]} bytes; files over {MAX_FETCHED_FILE} bytes "
                            f"are not fetched for a remote model", where=str(root / rel))
    return hub.read(rel)


def _raw_header(hub: HubFiles, root: HubRoot, rel: str) -> bytes:
    """The header JSON of shard ``rel``: its 8-byte length first, then exactly that many bytes."""
    size, where = hub.sizes[rel], str(root / rel)
    if size < 8:
        raise SafetensorsFormatError(f"file is {size} bytes, too short for a header", where=where)
    length = header_length(hub.read(rel, 0, 8), size, where)
    return hub.read(rel, 8, 8 + length)


def describe_transfer(report: dict) -> str:
    """One line: ``fetched 71.2 KB in 9 requests: 0.45% of the repository's 15.6 MB``."""
    from ..units import human_bytes, plural

    return (f"fetched {human_bytes(report['bytes_transferred'])} in "
            f"{plural(report['requests'], 'request')}: {report['fraction']:.2%} of the "
            f"repository's {human_bytes(report['repo_bytes'])} "
            f"({report['repo_id']}@{report['commit'][:12]})")


#: Endpoints a command line reaches without ``--endpoint`` (huggingface_hub's default).
DEFAULT_HOSTS = ("huggingface.co", "hf.co")


def command_words(report: dict) -> list[str]:
    """How a command line names the remote model a ``transfer_report`` describes so that it
    runs as printed, anywhere: ``hf://ORG/NAME@COMMIT`` (the very commit that was read), then
    ``--endpoint URL`` unless the hub is huggingface.co."""
    from urllib.parse import urlparse

    words = [f"{HF_SCHEME}{report['repo_id']}@{report['commit']}"]
    host = (urlparse(report.get("endpoint") or "").hostname or "").lower()
    if host and not any(host == h or host.endswith("." + h) for h in DEFAULT_HOSTS):
        words += ["--endpoint", report["endpoint"]]
    return words


__all__ = ["RemoteModel", "HubRoot", "is_remote", "describe_transfer", "command_words",
           "MAX_PARALLEL_FETCHES"]
