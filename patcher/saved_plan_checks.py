"""The checks a saved plan's values pass before anything runs (``patcher.saved_plan``): each
refusal is one line naming the plan file and the value."""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InputError
from .integrity.change_log import grouped
from .model.model_dir import MANIFEST_NAME, STATE_DIR, ModelDir
from .model.safetensors_io import DTYPE_BITS, OutputTensor, tensor_nbytes
from .names import name_problem
from .plan.changes import Change, with_one_recipe_line_key
from .plan.types import Action, FilePlan, PlanOptions
from .tensors.tasks import ShardTask, TensorJob, TensorSource

_RECIPE_NAME = re.compile(r"[a-z0-9][a-z0-9._+-]{0,299}\Z")     # names of several join by '+'
_DEVICE = re.compile(r"[a-z]{1,16}(:[0-9]{1,3})?\Z")
_OPS = ("copy", "cast", "dequantize", "quantize", "scale")


@dataclass(frozen=True)
class RecordedRecipe:
    """The recipe of a saved plan as it was bound when planned: what the executors and the
    manifest read of a recipe, and nothing to re-read or re-bind."""

    name: str
    sha256: str
    record: Mapping[str, Any]
    ident: Mapping[str, Any]

    def manifest_record(self) -> dict:
        return json.loads(json.dumps(self.record))

    def identity(self) -> dict:
        return json.loads(json.dumps(self.ident))


@dataclass(frozen=True)
class RecordedChange(Change):
    """A change-log record of a saved plan, as the plan's JSON wrote it (a recipe location under
    an older key read as ``recipe_line``)."""

    data: Mapping[str, Any]

    def to_json(self) -> dict:
        return dict(self.data)


class Checker:
    """One-line refusals naming the plan file."""

    def __init__(self, where: str):
        self.where = where

    def __call__(self, message: str):
        raise InputError(f"invalid plan: {message}", where=self.where)

    def text(self, value, what: str) -> str:
        return value if isinstance(value, str) else self(f"{what} is not a string")

    def int(self, value, what: str, *, optional: bool = False) -> int | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self(f"{what} is not a non-negative integer")
        return value

    def list(self, value, what: str) -> list:
        return value if isinstance(value, list) else self(f"{what} is not a list")

    def dict(self, value, what: str) -> dict:
        return value if isinstance(value, dict) else self(f"{what} is not an object")

    def name(self, value, what: str) -> str:
        problem = name_problem(value)
        if problem is not None:
            self(f"{what} {value!r} {problem}")
        if value == MANIFEST_NAME or value.split("/")[0] == STATE_DIR:
            self(f"{what} {value!r} is the manifest or in the state directory")
        return value


def fingerprint(value, bad: Checker) -> dict[str, tuple]:
    out = {}
    for rel, stamp in bad.dict(value, "fingerprint").items():
        if not (isinstance(stamp, list) and len(stamp) == 5):
            bad(f"fingerprint of {rel!r} is not [device, inode, size, mtime_ns, link]")
        for n in stamp[:4]:
            bad.int(n, f"fingerprint of {rel!r}")
        if stamp[4] is not None:
            bad.text(stamp[4], f"link text of {rel!r}")
        out[rel] = tuple(stamp)
    return out


def options(value, bad: Checker) -> PlanOptions:
    value = bad.dict(value, "options")
    if value.get("params") is not None:
        bad.dict(value["params"], "options.params")
    try:
        options = PlanOptions.of(value)
    except InputError as exc:
        bad(exc.message)
    if options.in_place or not isinstance(options.link, str):
        bad("options are not those of a new variant")
    bad.int(options.jobs, "options.jobs", optional=True)
    bad.int(options.max_shard_size, "options.max_shard_size", optional=True)
    if options.device is not None and not _DEVICE.match(str(options.device)):
        bad("options.device is not a device name")
    if options.params is not None:
        bad.dict(options.params, "options.params")
    return options


def recipe(value, bad: Checker) -> RecordedRecipe:
    value = bad.dict(value, "recipe")
    record, ident = bad.dict(value.get("record"), "recipe.record"), \
        bad.dict(value.get("identity"), "recipe.identity")
    name, sha = record.get("name"), record.get("sha256")
    if not isinstance(name, str) or not _RECIPE_NAME.match(name) or ident.get("name") != name:
        bad("recipe.record.name is not a recipe name")
    if not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        bad("recipe.record.sha256 is not a sha256")
    bad.text(record.get("text"), "recipe.record.text")
    return RecordedRecipe(name, sha, record, ident)


def changes(value, bad: Checker) -> tuple:
    entries = bad.list(value, "changes")
    if not all(isinstance(e, dict) and isinstance(e.get("kind"), str) for e in entries):
        bad("a changes entry is not an object with a kind")
    try:
        grouped(entries)            # the manifest's grouping must accept every record
    except Exception as exc:       # noqa: BLE001 (any failure is a malformed record)
        bad(f"the change log is malformed ({type(exc).__name__})")
    return tuple(RecordedChange(with_one_recipe_line_key(e)) for e in entries)


def file(entry, fingerprint: dict, model: ModelDir, bad: Checker) -> FilePlan:
    entry = bad.dict(entry, "files entry")
    try:
        action = Action(entry.get("action"))
    except ValueError:
        bad(f"unknown action {entry.get('action')!r}")
    path, source = bad.name(entry.get("path"), "path"), entry.get("source")
    if source is not None and source not in fingerprint:
        bad(f"source {source!r} is not a file of the base")
    if action in (Action.LINK, Action.DROP, Action.WRITE_JSON) and source != path or \
            action is Action.ADD and source not in (None, path):
        bad(f"{action.value} {path!r} has another source")
    if action in (Action.WRITE_JSON, Action.REWRITE_SHARD) and source is None:
        bad(f"{action.value} {path!r} has no source")
    content = entry.get("content")
    if (content is None) != (action not in (Action.WRITE_JSON, Action.ADD)):
        bad(f"{action.value} {path!r} has content where it should not, or none")
    if content is not None:
        try:
            content = base64.b64decode(bad.text(content, "content"), validate=True)
        except ValueError:
            bad(f"the content of {path!r} is not base64")
    size_after = bad.int(entry.get("size_after"), "size_after", optional=True)
    if content is not None and size_after != len(content):
        bad(f"size_after of {path!r} is not its content's size")
    diff = entry.get("diff")
    if diff is not None:
        bad.text(diff, "diff")
    task, gguf = entry.get("shard_task"), entry.get("gguf_task")
    if (task is not None and gguf is not None) or \
            (task is None and gguf is None) != (action is not Action.REWRITE_SHARD):
        bad(f"{action.value} {path!r} has a shard task where it should not, or none")
    if task is not None:
        task = _task(task, path, model, bad)
    elif gguf is not None:
        task = _gguf_task(gguf, path, model, bad)
    return FilePlan(path, action, source=source,
                    size_before=bad.int(entry.get("size_before"), "size_before", optional=True),
                    size_after=size_after, content=content, diff=diff, shard_task=task)


def _task(value, path: str, model: ModelDir, bad: Checker) -> ShardTask:
    value = bad.dict(value, "shard_task")
    if value.get("output") != path or not path.endswith(".safetensors"):
        bad(f"the shard task of {path!r} writes another file")
    metadata = value.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        bad(f"the metadata of {path!r} is not an object of strings")
    device = bad.text(value.get("device"), "device")
    if not _DEVICE.match(device):
        bad(f"device {device!r} is not a device name")
    jobs = tuple(_job(j, path, model, bad) for j in bad.list(value.get("jobs"), "jobs"))
    return ShardTask(output=path, metadata=metadata, jobs=jobs, device=device)


def _gguf_task(value, path: str, model: ModelDir, bad: Checker):
    """A GGUF file's rewrite: its new header, then byte ranges of base files. Every range lies
    inside a file of the base; the header is checked as readers read it when written
    (``gguf.readback``)."""
    from .gguf.task import GGUFTask

    value = bad.dict(value, "gguf_task")
    if value.get("output") != path or not path.endswith(".gguf"):
        bad(f"the GGUF task of {path!r} writes another file")
    try:
        header = base64.b64decode(bad.text(value.get("header"), "header"), validate=True)
    except ValueError:
        bad(f"the header of {path!r} is not base64")
    copies = []
    for copy in bad.list(value.get("copies"), "copies"):
        if not (isinstance(copy, list) and len(copy) == 5 and isinstance(copy[0], str)):
            bad(f"a copy into {path!r} is not [tensor, file, offset, nbytes, padding]")
        name, rel, offset, nbytes, pad = copy
        f = model.files.get(rel) if isinstance(rel, str) else None
        offset, nbytes = bad.int(offset, "offset"), bad.int(nbytes, "nbytes")
        if f is None or offset + nbytes > f.size or not 0 <= bad.int(pad, "padding") < 1 << 20:
            bad(f"tensor {name!r} of {path!r} is not a range of a file of the base")
        copies.append((name, str(f.path), offset, nbytes, pad))
    changed = tuple(bad.text(c, "changed") for c in bad.list(value.get("changed"), "changed"))
    return GGUFTask(path, header, tuple(copies), changed)


def _job(value, path: str, model: ModelDir, bad: Checker) -> TensorJob:
    value = bad.dict(value, "tensor job")
    out, op = bad.list(value.get("out"), "out"), value.get("op")
    if op not in _OPS:
        bad(f"unknown tensor job {op!r} in {path!r}")
    if len(out) != 3 or not isinstance(out[0], str) or not isinstance(out[1], str) \
            or out[1] not in DTYPE_BITS:
        bad(f"an output tensor of {path!r} is not [name, dtype, shape]")
    output = OutputTensor(out[0], out[1], _shape(out[2], bad))
    inputs = tuple(_source(s, model, bad) for s in bad.list(value.get("inputs"), "inputs"))
    if not inputs:
        bad(f"tensor {out[0]!r} of {path!r} reads nothing")
    params = []
    for pair in bad.list(value.get("params"), "params"):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            bad(f"a parameter of tensor {out[0]!r} is not [name, value]")
        params.append((pair[0], _tupled(pair[1])))
    job = TensorJob(out=output, op=op, inputs=inputs, params=tuple(params))
    problem = _job_problem(job)
    if problem is not None:
        bad(f"the {op} of tensor {out[0]!r} in {path!r} {problem}")
    return job


_CAST_TO = ("BF16", "F16", "F32")           # what cast and dequantize compute to
_PARAM_KEYS = {"copy": set(), "cast": {"to"}, "dequantize": {"scheme", "to", "block"},
               "quantize": {"scheme", "layout", "block", "role"}, "scale": {"reciprocal", "to"}}


def _job_problem(job: TensorJob) -> str | None:
    """Why ``job`` is not one the planner makes (the kernels trust their parameters), or None:
    its parameters, and the output they give from its first input."""
    from .recipe.tensor_ops.split_scale import SCALE_DTYPES
    from .tensors.schemes import SCHEMES

    params, out, first = dict(job.params), job.out, job.inputs[0]
    if len(params) != len(job.params) or not set(params) <= _PARAM_KEYS[job.op]:
        return "has parameters its operation does not take"
    to = params.get("to")
    if job.op == "copy":
        same = (out.dtype, tuple(out.shape)) == (first.dtype, tuple(first.shape))
        return None if same and len(job.inputs) == 1 else "does not copy its one input"
    if job.op in ("cast", "dequantize") and (to not in _CAST_TO or to != out.dtype):
        return "does not compute to its output's dtype"
    if job.op == "cast" and (tuple(out.shape) != tuple(first.shape) or len(job.inputs) != 1):
        return "does not keep its one input's shape"
    if job.op == "scale":
        ok = params.get("reciprocal") in (None, "exact", "nearest") and to in SCALE_DTYPES \
            and math.prod(out.shape) == math.prod(first.shape) and len(job.inputs) == 1
        return None if ok and to == out.dtype else "has a parameter out of range"
    scheme = SCHEMES.get(params.get("scheme")) if isinstance(params.get("scheme"), str) else None
    block = params.get("block")
    sizes = block if isinstance(block, tuple) else () if block is None else (block,)
    if scheme is None or len(sizes) > 2 or not all(
            isinstance(b, int) and not isinstance(b, bool) and 0 < b <= 1 << 20 for b in sizes):
        return "names no known scheme or block"
    if job.op == "quantize":
        layout = params.get("layout")
        try:
            outputs = scheme.quantized_outputs(first.name, first.shape, layout, block) \
                if layout in scheme.layouts else []
        except Exception:          # noqa: BLE001 (any refusal: not a job the planner makes)
            outputs = []
        if (out.name, out.dtype, tuple(out.shape), params.get("role")) not in [
                (n, d, tuple(sh), r) for n, d, sh, r in outputs]:
            return "is not an output its scheme writes"
    return None


def _source(value, model: ModelDir, bad: Checker) -> TensorSource:
    """A tensor the job reads: exactly an entry of its base shard's header."""
    if not (isinstance(value, list) and len(value) == 6):
        bad("a tensor source is not [shard, name, dtype, shape, offset, nbytes]")
    shard, name, dtype, shape, offset, nbytes = value
    header = model.shards.get(shard) if isinstance(shard, str) else None
    info = header.tensors.get(name) if header is not None and isinstance(name, str) else None
    if info is None or (dtype, _shape(shape, bad), offset, nbytes) != (
            info.dtype, tuple(info.shape), header.data_offset + info.start, info.nbytes):
        bad(f"tensor source {name!r} in {shard!r} is not a tensor of the base")
    return TensorSource(path=str(header.path), shard=shard, name=name, dtype=dtype,
                        shape=tuple(info.shape), offset=offset, nbytes=nbytes)


def _shape(value, bad: Checker) -> tuple[int, ...]:
    if not (isinstance(value, list) and len(value) <= 8):
        bad("a shape is not a list of at most 8 sizes")
    shape = tuple(bad.int(n, "a shape's size") for n in value)
    if tensor_nbytes("U8", shape) > 1 << 50:
        bad("a shape is larger than any tensor")
    return shape


def _tupled(value):
    """A parameter as the planner made it (tuples, not JSON's lists)."""
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value
