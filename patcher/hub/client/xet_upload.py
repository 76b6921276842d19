"""What a ``publish`` through Xet really sent.

huggingface_hub uploads a commit's files through ``hf_xet`` when the hub offers Xet: every file
is cut into content-defined chunks, and a chunk the hub already holds (the base's, for a shard
a recipe rewrote) is referenced, not sent (``hf_xet`` asks the hub's global-dedupe query, then
dedupes against the shard it answers). ``hf_xet`` counts, per file, the bytes of new chunks and
the bytes of the chunks that were new; huggingface_hub drops those counts, so ``recording``
keeps the upload handles of the block and ``XetSent`` sums them for the publish line.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from ...units import human_bytes, plural


@dataclass
class XetSent:
    """The files uploaded through Xet: their bytes, and the bytes of the chunks the hub lacked,
    which are all that was sent of them (before compression)."""

    files: int = 0
    file_bytes: int = 0
    new_bytes: int = 0

    def summary(self) -> str:
        share = f"{100 * self.new_bytes / self.file_bytes:.1f}%" if self.file_bytes else "0%"
        return (f"{plural(self.files, 'file')} ({human_bytes(self.file_bytes)}) through Xet: "
                f"{human_bytes(self.new_bytes)} of new chunks sent ({share}), "
                f"{human_bytes(max(0, self.file_bytes - self.new_bytes))} already on the hub")


@contextmanager
def recording():
    """Keep the ``hf_xet`` upload handles huggingface_hub starts inside the block; yields the
    ``XetSent`` that is filled in once the block ends (zero when nothing went through Xet)."""
    from huggingface_hub.utils import _xet

    sent = XetSent()
    handles: list = []
    original = _xet.get_xet_session
    _xet.get_xet_session = lambda: _Session(original(), handles)
    try:
        yield sent
    finally:
        _xet.get_xet_session = original
    for handle in handles:
        metrics = _metrics(handle)
        if metrics is None:
            continue
        sent.files += 1
        sent.file_bytes += int(getattr(metrics, "total_bytes", 0) or 0)
        sent.new_bytes += int(getattr(metrics, "new_bytes", 0) or 0)


def _metrics(handle):
    try:
        return handle.result().dedup_metrics
    except Exception:           # an upload that failed: the commit's own error says why
        return None


class _Session:
    """``hf_xet.XetSession``, whose upload commits keep their handles."""

    def __init__(self, inner, handles: list):
        self._inner, self._handles = inner, handles

    def new_upload_commit(self, *args, **kwargs):
        return _Commit(self._inner.new_upload_commit(*args, **kwargs), self._handles)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


class _Commit:
    def __init__(self, inner, handles: list):
        self._inner, self._handles = inner, handles

    def __enter__(self):
        self._inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)

    def start_upload_file(self, *args, **kwargs):
        return self._kept(self._inner.start_upload_file(*args, **kwargs))

    def start_upload_bytes(self, *args, **kwargs):
        return self._kept(self._inner.start_upload_bytes(*args, **kwargs))

    def _kept(self, handle):
        self._handles.append(handle)
        return handle

    def __getattr__(self, name: str):
        return getattr(self._inner, name)
