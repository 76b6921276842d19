"""The GGUF files of a model directory: single files and split sets, checked for consistency.

A split set is ``NAME-00001-of-0000N.gguf`` ... with the keys ``split.no`` (0-based),
``split.count`` and ``split.tensors.count`` (llama.cpp's gguf-split). Every file of a set must
be present, numbered as named, agree on the count, and hold distinct tensors that add up to
``split.tensors.count``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ModelDirError
from .format import GGUFHeader, read_header

SPLIT_NAME = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"


@dataclass(frozen=True)
class GGUFModel:
    """One model: a single GGUF file or a complete split set, in order."""

    name: str                        # the file, or the set's stem
    files: tuple[str, ...]           # relpaths
    headers: tuple[GGUFHeader, ...]

    @property
    def first(self) -> GGUFHeader:
        return self.headers[0]

    @property
    def architecture(self) -> str | None:
        return self.first.architecture

    def tensor_count(self) -> int:
        return sum(len(h.tensors) for h in self.headers)


def gguf_relpaths(model) -> list[str]:
    return sorted(rel for rel in model.files if rel.endswith(".gguf"))


def gguf_models(model) -> list[GGUFModel]:
    """Every GGUF model in ``model`` (a ``ModelDir``), headers parsed and splits checked."""
    singles, sets = [], {}
    for rel in gguf_relpaths(model):
        m = SPLIT_NAME.fullmatch(rel)
        if m:
            sets.setdefault((m["stem"], int(m["count"])), []).append((int(m["no"]), rel))
        else:
            singles.append(rel)
    out = []
    for rel in singles:
        header = read_header(model.files[rel].path, where=str(model.root / rel))
        # llama.cpp's gguf-split --merge leaves split.count 0 in the merged file
        if SPLIT_COUNT in header.kv and header.get(SPLIT_COUNT) not in (0, 1):
            raise ModelDirError(f"has split.count {header.get(SPLIT_COUNT)} but is not named "
                                "as a split file (NAME-00001-of-0000N.gguf)",
                                where=model.root / rel)
        out.append(GGUFModel(rel, (rel,), (header,)))
    for (stem, count), parts in sorted(sets.items()):
        out.append(_split_set(model, stem, count, sorted(parts)))
    return out


def _split_set(model, stem: str, count: int, parts: list[tuple[int, str]]) -> GGUFModel:
    where = model.root / parts[0][1]
    numbers = [no for no, _ in parts]
    if numbers != list(range(1, count + 1)):
        missing = sorted(set(range(1, count + 1)) - set(numbers))
        raise ModelDirError(f"split set {stem!r} of {count} files lacks file(s) "
                            f"{', '.join(f'{n:05d}' for n in missing) or '(misnumbered)'}",
                            where=where)
    headers, names = [], set()
    for no, rel in parts:
        header = read_header(model.files[rel].path, where=str(model.root / rel))
        if header.get(SPLIT_NO) != no - 1 or header.get(SPLIT_COUNT) != count:
            raise ModelDirError(f"split keys say file {header.get(SPLIT_NO)!r} of "
                                f"{header.get(SPLIT_COUNT)!r}; the name says {no - 1} of "
                                f"{count} (split.no counts from 0)", where=model.root / rel)
        dup = names & set(header.tensors)
        if dup:
            raise ModelDirError(f"tensor {sorted(dup)[0]!r} is in more than one file of the "
                                "split set", where=model.root / rel)
        names |= set(header.tensors)
        headers.append(header)
    declared = headers[0].get(SPLIT_TENSORS)
    if declared != len(names):
        raise ModelDirError(f"split.tensors.count is {declared!r} but the set holds "
                            f"{len(names)} tensors", where=where)
    return GGUFModel(stem, tuple(rel for _, rel in parts), tuple(headers))
