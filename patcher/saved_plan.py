"""Saved plans: ``modelpatch plan RECIPE MODEL --save PLAN.json`` writes the plan,
``modelpatch apply PLAN.json`` carries out exactly it.

What a reviewer approved is what runs: applying a saved plan reads no recipe and plans nothing.
The file holds the plan's every decision (each file's action and new bytes, each shard's tensor
jobs, the recipe as bound, the options, the change log) and what the plan read of the base
(``Plan.fingerprint``): a base changed since is refused in one line, nothing written.

A plan file is untrusted input, like a recipe. It is size-capped (``MAX_PLAN_BYTES``),
schema-versioned (``FORMAT``, ``VERSION``) and checked whole before anything runs: every output
name is a plain relative name outside the state directory and the manifest, every file it reads
is one the fingerprint lists, and every tensor a job reads is exactly a tensor of the base
shard's header (name, dtype, shape, offsets), or for a GGUF rewrite a byte range inside a base
file. Its ``sha256`` (of the canonical JSON of the rest)
catches a file edited by hand or cut short; it is not a signature: the checks above are what
keep a crafted file from reading or writing anything but the base's files and the variant. For
the same reason applying a plan never recovers an interrupted in-place patch of the directory it
names, as other commands do first: a base left so has changed, and the plan is stale.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import fields
from pathlib import Path

from . import saved_plan_checks as checks
from .changes import changes_json
from .errors import InputError, PlanError
from .file_task import TaskKind
from .fsops import read_capped, replace_file
from .model.model_dir import ModelDir
from .plan import FilePlan, Plan, PlanOptions, check_unchanged
from .saved_plan_checks import Checker
from .units import human_bytes

FORMAT = "modelpatch.plan"
VERSION = 1
MAX_PLAN_BYTES = 1 << 30
"""The largest plan file read. A saved plan of the example models takes 1.0 to 1.8 KB per
tensor job (its change log and diffs included): this admits plans of several hundred thousand
tensors."""

_KEYS = {"format", "version", "base", "fingerprint", "options", "recipe", "changes",
         "warnings", "files", "sha256"}


# -- writing -----------------------------------------------------------------------------------

def plan_document(plan: Plan) -> dict:
    """``plan`` as the saved-plan JSON document. Raises InputError for a plan that cannot be
    carried out from a file alone: of a model on a hub, of one .gguf file, or in place."""
    if plan.fingerprint is None:
        raise InputError("a plan of a model on a hub cannot be saved: `apply PLAN.json` runs "
                         "on local files", where=plan.base, hint="download the model first")
    if plan.base_subset or plan.options.in_place:
        raise InputError("only a plan for a new variant of a model directory can be saved "
                         "(not one of a single .gguf file, nor in place)", where=plan.base)
    for f in plan.files:
        if f.shard_task is not None and f.shard_task.kind is TaskKind.GGUF_HEADER:
            raise InputError(f"a plan that rewrites the header of {f.path} in place cannot be "
                             f"saved", where=plan.base)
    carried = plan.options.out_of_place()       # link "auto" unless a mode was given
    options = {f.name: getattr(carried, f.name) for f in fields(PlanOptions)}
    body = {
        "format": FORMAT, "version": VERSION, "base": os.path.abspath(plan.base),
        "fingerprint": {rel: list(stamp) for rel, stamp in plan.fingerprint.items()},
        "options": options,
        "recipe": {"record": plan.recipe.manifest_record(), "identity": plan.recipe.identity()},
        "changes": changes_json(plan.changes), "warnings": list(plan.warnings),
        "files": [_file_doc(f, plan.base) for f in plan.files],
    }
    body = json.loads(json.dumps(body))        # plain JSON values, as a reader will see them
    return {**body, "sha256": _digest(body)}


def save_plan(plan: Plan, path: str | os.PathLike) -> Path:
    """Write ``plan`` to ``path`` atomically (whole, or not at all)."""
    data = json.dumps(plan_document(plan), separators=(",", ":"),
                      ensure_ascii=True).encode("ascii") + b"\n"
    target = Path(path)
    if not target.parent.is_dir():
        raise InputError("the plan file's directory does not exist", where=target.parent)
    replace_file(target, data, mode=0o644)
    return target


def _file_doc(f: FilePlan, base: Path) -> dict:
    task = f.shard_task
    out = {"path": f.path, "action": f.action.value, "source": f.source,
           "size_before": f.size_before, "size_after": f.size_after,
           "content": None if f.content is None else base64.b64encode(f.content).decode(),
           "diff": f.diff, "shard_task": None, "gguf_task": None}
    if task is not None and task.kind is TaskKind.GGUF:      # by base relpath, as a shard's
        out["gguf_task"] = {
            "output": task.output, "header": base64.b64encode(task.header).decode(),
            "copies": [[name, Path(path).relative_to(base).as_posix(), offset, nbytes, pad]
                       for name, path, offset, nbytes, pad in task.copies],
            "changed": list(task.changed)}
        return out
    return {**out,
            "shard_task": None if task is None else {
                "output": task.output, "metadata": task.metadata, "device": task.device,
                "jobs": [{"out": [j.out.name, j.out.dtype, list(j.out.shape)], "op": j.op,
                          "inputs": [[s.shard, s.name, s.dtype, list(s.shape), s.offset,
                                      s.nbytes] for s in j.inputs],
                          "params": [[k, v] for k, v in j.params]} for j in task.jobs]}}


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=True).encode("ascii")).hexdigest()


# -- reading -----------------------------------------------------------------------------------

def is_plan_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a saved plan (a ``.json`` file that starts as one), not a
    recipe."""
    if not (str(path).endswith(".json") and os.path.isfile(path)):
        return False
    try:
        with open(path, "rb") as f:
            start = f.read(256)
    except OSError:
        return False
    return start.replace(b" ", b"").replace(b"\n", b"").startswith(
        b'{"format":"' + FORMAT.encode() + b'"')


def load_plan(path: str | os.PathLike) -> tuple[Plan, ModelDir]:
    """The plan saved at ``path`` and its base, opened; refused in one line (naming the file)
    when the file is not a valid plan of this version, or the base changed since it was made.

    Raises:
        InputError: not a plan file, another version, or a value that fails the checks.
        PlanError: the plan is stale (its base changed since).
    """
    try:
        return _load(path)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        # a value of a shape no check above foresaw: refused like the others
        raise InputError(f"invalid plan: a value has the wrong shape ({type(exc).__name__})",
                         where=str(path)) from None


def _load(path: str | os.PathLike) -> tuple[Plan, ModelDir]:
    where = str(path)
    doc = _read(Path(path))
    bad = Checker(where)
    base = Path(bad.text(doc["base"], "base"))
    if not base.is_absolute():
        bad("base is not an absolute path")
    fingerprint = checks.fingerprint(doc["fingerprint"], bad)
    options = checks.options(doc["options"], bad)
    recipe = checks.recipe(doc["recipe"], bad)
    changes = checks.changes(doc["changes"], bad)
    warnings = tuple(bad.text(w, "warnings entry")
                     for w in bad.list(doc["warnings"], "warnings"))
    skeleton = Plan(recipe=recipe, base=base, files=(), changes=changes,  # type: ignore[arg-type]
                    warnings=warnings, options=options, fingerprint=fingerprint)
    if not base.is_dir():
        raise PlanError("plan is stale: its base directory is gone", where=base)
    check_unchanged(skeleton)           # before the base's headers are read
    model = ModelDir.open(base)
    check_unchanged(skeleton)
    files = tuple(checks.file(entry, fingerprint, model, bad)
                  for entry in bad.list(doc["files"], "files"))
    paths = [f.path for f in files]
    if len(set(paths)) != len(paths):
        bad("files lists an output path twice")
    _check_devices(files, options, bad)
    return Plan(recipe=skeleton.recipe, base=base, files=files, changes=changes,
                warnings=warnings, options=options, fingerprint=fingerprint), model


def _check_devices(files: tuple[FilePlan, ...], options: PlanOptions, bad: Checker) -> None:
    """Every shard task runs on the options' device (what the manifest records), and that
    device is usable here: checked before anything is written, as planning checks it."""
    tasks = {f.path: f.shard_task.device for f in files
             if f.shard_task is not None and f.shard_task.kind is TaskKind.SAFETENSORS}
    if not tasks:
        return
    from .tensors.planning import check_device

    device = check_device(options.device)
    for path, task_device in tasks.items():
        if task_device != device:
            bad(f"the shard task of {path!r} runs on device {task_device!r}, not on the "
                f"plan's device {device!r}")


def _read(path: Path) -> dict:
    from .config.jsonfile import parse_json
    from .fsops import TooLarge

    try:
        data = read_capped(path, MAX_PLAN_BYTES)
    except TooLarge as exc:
        raise InputError(f"the plan file holds {human_bytes(exc.size)}, more than the "
                         f"{human_bytes(MAX_PLAN_BYTES)} a plan may", where=path) from None
    except OSError as exc:
        raise InputError(f"cannot read the plan file: {exc.strerror or exc}", where=path) \
            from None
    doc = parse_json(data, str(path), constants=False)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"not a modelpatch plan (no \"format\": \"{FORMAT}\")", where=path)
    if doc.get("version") != VERSION:
        raise InputError(f"plan format version {doc.get('version')!r} is not supported (this "
                         f"modelpatch reads version {VERSION})", where=path,
                         hint="make the plan again with this modelpatch")
    if set(doc) != _KEYS:
        raise InputError(f"the plan's keys are not those of version {VERSION}: "
                         f"{', '.join(sorted(set(doc) ^ _KEYS))}", where=path)
    body = {k: v for k, v in doc.items() if k != "sha256"}
    if doc["sha256"] != _digest(body):
        raise InputError("the plan file was modified after it was written (its sha256 does not "
                         "match its content)", where=path, hint="make the plan again")
    return doc


# -- applying ----------------------------------------------------------------------------------

def apply_saved_plan(path: str | os.PathLike, model: str | os.PathLike | None = None, *,
                     out: str | os.PathLike | None = None, force: bool = False,
                     progress=None, base_model: str | None = None, jobs: int | None = None,
                     executor: str | None = None, ray_address: str | None = None,
                     signer=None, trust=None):
    """Carry out the plan saved at ``path`` as a new variant at ``out`` (default: where
    ``apply`` would write it). ``model``, when given, must be the plan's base. ``jobs``,
    ``executor`` and ``ray_address`` say how the work runs, never what it writes; the rest is
    the plan's; ``signer`` and ``trust`` as ``api.apply``'s ``sign`` and ``require_signed_base``,
    loaded (``patcher.signatures``). Returns the ``ApplyResult``."""
    from dataclasses import replace

    from .execute.engine import apply_plan, default_output
    from .execute.executors import executing
    from .execute.linking import predict_for_plan, warn_before_copying
    from .execute.locking import lock_directory

    the_plan, base = load_plan(path)
    if model is not None and os.path.realpath(model) != os.path.realpath(the_plan.base):
        raise PlanError(f"the plan was made for {the_plan.base}, not this model", where=model,
                        hint="make a plan of this model")
    options = PlanOptions.of(the_plan.options, jobs=jobs, executor=executor,
                             ray_address=ray_address)
    the_plan = replace(the_plan, options=options)
    target = Path(out) if out is not None else default_output(base.root, the_plan.recipe.name)
    with lock_directory(base.root, exclusive=False):
        check_unchanged(the_plan)
        the_plan = predict_for_plan(the_plan, target, options.link)
        warn_before_copying(the_plan.link)
        from .signatures import base_signature_of

        with executing(options.executor, options.ray_address):     # as all the plan's work
            base_signature = base_signature_of(base, trust, options.jobs)
        return apply_plan(the_plan, base, target, force=force, progress=progress,
                          base_model=base_model, signer=signer, base_signature=base_signature)
