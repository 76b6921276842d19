"""The library API: one function per command. The CLI is a thin layer over these.

Results are typed, frozen data (``plan``: a ``Plan``, the applies: an ``ApplyResult``,
``inspect``: an ``InspectReport``, ``doctor``: a ``DoctorReport``); ``to_json()`` is ``--json``'s.

Example:
    >>> from patcher import api
    >>> result = api.apply("sm120-fp16-kv", "/models/kimi")    # doctest: +SKIP
    >>> api.verify(result.output).ok                           # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from . import signatures
from .errors import InputError
from .execute.executors import executing
from .model_ref import HF_SCHEME, ModelKind, ModelRef  # noqa: F401  (HF_SCHEME: callers know it)
from .opening import (  # noqa: F401  (recover, open_model, resolve_model: the API's own)
    local_model,
    open_local,
    open_model,
    open_recovered,
    output_for,
    recover,
    recovered,
    require_model,
    resolve_model,
)
from .signatures import base_signature_of, signer_of, trust_of

# Heavier modules (the engine, the recipe loader and its YAML library, huggingface_hub) are
# imported by the functions that need them, so `inspect` and `--help` stay light.
if TYPE_CHECKING:
    from .doctor.report import DoctorReport
    from .execute.engine import ApplyResult, Progress
    from .model.inspect_report import InspectReport
    from .plan import Plan, PlanOptions
    from .recipe.load import Recipe

log = logging.getLogger("modelpatch")


def load(recipe: str | os.PathLike | Recipe | list | tuple) -> Recipe:
    """A recipe from a path, a built-in name, or an already loaded ``Recipe``; a list of those
    is one recipe applying each in order (``recipe.load.load_recipes``)."""
    from .recipe.load import load_recipes

    return load_recipes(recipe)


def inspect(model: str | os.PathLike, *, endpoint: str | None = None) -> InspectReport:
    """The report of ``inspect``: a ``patcher.model.inspect_report.InspectReport``
    (``to_json()`` is ``--json``'s). Raises ModelDirError for a directory with neither a
    config.json nor a safetensors file: that is not a model (an empty report would pass).
    ``hf://org/name[@rev]`` is read from the hub (``endpoint``) without its tensor data; the
    report's ``remote`` then says what that transferred."""
    from .model.inspect_model import inspect_model
    from .model.inspect_report import InspectReport

    ref = ModelRef.parse(model)
    if ref.kind is ModelKind.GGUF_FILE and Path(model).is_file():
        from .gguf.inspect import inspect_gguf_file

        alone = inspect_gguf_file(Path(model))
        return InspectReport.gguf_only(alone["path"], alone["models"])
    opened = open_model(model, endpoint=endpoint)
    gguf = None
    if require_model(opened):
        from .gguf.inspect import inspect_gguf_dir

        gguf = inspect_gguf_dir(opened)
    if not opened.has("config.json") and not opened.shards:
        return InspectReport.gguf_only(str(opened.root), gguf or [])
    return InspectReport.of(inspect_model(opened), gguf=gguf,
                            remote=opened.transfer_report() if ref.is_hub else None)


def plan(recipe: str | os.PathLike | Recipe, model: str | os.PathLike,
         *, options: PlanOptions | dict | None = None, out: str | os.PathLike | None = None,
         endpoint: str | None = None) -> Plan:
    """The plan for applying ``recipe`` to ``model``; nothing is written. ``options``: a
    ``PlanOptions``, or a dict of its field names. Unless ``options.in_place``, it predicts how
    the base's files will be carried into ``out`` (default: where ``apply`` would write) in
    ``options.link`` mode (default ``auto``). For ``hf://org/name[@rev]`` (read without its
    tensor data) there is no such prediction, and ``plan.transfer`` says what reading it
    transferred."""
    from .execute.linking import predict_for_plan
    from .gguf.single_file import check_in_place, is_gguf_file
    from .plan import PlanOptions

    options = PlanOptions.of(options)
    if options.in_place and is_gguf_file(model):
        check_in_place(model)           # as apply_in_place: refused, or the whole directory
        model = Path(model).parent
    loaded, base = load(recipe), open_model(model, endpoint=endpoint, what="plan")
    the_plan = _make_plan(loaded, base, options, endpoint)
    if ModelRef.parse(model).is_hub:
        return replace(the_plan, transfer=base.transfer_report())
    if the_plan.options.in_place:
        return the_plan
    target = output_for(model, base, loaded.name, out)
    return predict_for_plan(the_plan, target, the_plan.options.link or "auto")


def apply(recipe: str | os.PathLike | Recipe, model: str | os.PathLike, *,
          options: PlanOptions | dict | None = None, out: str | os.PathLike | None = None,
          force: bool = False, progress: Progress | None = None, base_model: str | None = None,
          allow_noop: bool = False, endpoint: str | None = None, sign=None,
          require_signed_base=None, **given) -> ApplyResult:
    """Apply ``recipe`` to ``model`` and write a new variant (default: ``<model>-<recipe>``;
    ``hf://ORG/NAME[@REV]`` is downloaded first and written to ``NAME-<recipe>`` here).
    ``options``: a ``PlanOptions`` (or a dict of its field names), as for ``plan``; the
    keywords ``given`` (``link``, ``force_copy``, ``jobs``, ``device``, ``max_shard_size``,
    ``params``, ``executor``, ``ray_address``) set those fields (``PlanOptions.of``). The
    executor reads them from the plan only.
    ``sign`` (a private key path, a ``patcher.signing.keys.KeySigner`` or ``"sigstore"``): the
    variant is committed with its OMS ``model.sig``, written last from the manifest's digests.
    ``require_signed_base`` (a public key path or a ``patcher.signing.verify.Trust``): refuse a
    base that is not signed by it, or whose files differ from what it signed.

    ``params``: values for the recipe's ``params:`` (typed, or strings as ``--set`` gives them;
    ``RECIPE.NAME`` for one of several recipes). ``endpoint``: the hub of an ``hf://`` model
    and of ``from: hf://`` sources (default ``$HF_ENDPOINT``, then huggingface.co).
    ``base_model`` (``ORG/NAME``) is recorded in the manifest as the hub repository the base
    is, for the model card; left out, it is read from the base where it says
    (``patcher.model.base_identity``).

    ``link`` (``auto``, ``reflink``, ``hardlink``, ``copy``; ``force_copy=True`` is ``copy``)
    says how the base's unchanged files are carried (``patcher.execute.linking``); ``auto`` warns on
    the log before copying more than ``linking.copy_warn_bytes()``. ``max_shard_size`` (bytes)
    reshards the variant, overriding the recipe's ``output.max_shard_size``. A plan that changes
    nothing raises ``NothingToChange`` (nothing is written) unless ``allow_noop``.

    ``executor="ray"`` runs the shard tasks and file hashes on the Ray cluster at
    ``ray_address`` (``patcher.execute.ray_executor``); the rest runs here."""
    from .execute.engine import apply_plan
    from .execute.linking import predict_for_plan, warn_before_copying
    from .execute.locking import lock_directory
    from .gguf.single_file import model_directory
    from .plan import PlanOptions

    options = PlanOptions.of(options, **given).out_of_place()
    if options.in_place:
        raise InputError("in_place=True patches the model itself: call apply_in_place()")
    loaded, base_model = load(recipe), _checked_base_model(base_model)
    signer, trust = signer_of(sign), trust_of(require_signed_base)   # refused before any work
    model, out = local_model(model, out, loaded.name, endpoint=endpoint)
    # Plan under the base's shared lock, so an in-place patch or revert cannot change the base
    # between planning and linking.
    recovered(model_directory(model))
    with lock_directory(model_directory(model), exclusive=False):
        base = open_recovered(model)
        the_plan = _make_plan(loaded, base, options, endpoint, allow_noop=allow_noop)
        target = output_for(model, base, loaded.name, out)
        the_plan = predict_for_plan(the_plan, target, options.link)
        warn_before_copying(the_plan.link)
        with executing(options.executor, options.ray_address):
            base_signature = base_signature_of(base, trust, options.jobs)
        return apply_plan(the_plan, base, target, force=force, progress=progress,
                          base_model=base_model, signer=signer, base_signature=base_signature)


def save_plan(the_plan: Plan, path: str | os.PathLike) -> Path:
    """Write ``the_plan`` (of ``plan``) to ``path`` for ``apply_saved`` (``patcher.saved_plan``:
    a plan for a new variant of a local model directory)."""
    from .saved_plan import save_plan as save

    return save(the_plan, path)


def apply_saved(plan_file: str | os.PathLike, model: str | os.PathLike | None = None, *,
                sign=None, require_signed_base=None, **kwargs) -> ApplyResult:
    """Carry out exactly the plan saved at ``plan_file``: no recipe is read, nothing is
    planned again, and a base changed since the plan was made is refused (``PlanError``).
    ``model``, when given, must be the plan's base; ``sign`` and ``require_signed_base`` as for
    ``apply``; ``kwargs``: ``out``, ``force``, ``progress``, ``base_model``, ``jobs``,
    ``executor``, ``ray_address`` (``patcher.saved_plan.apply_saved_plan``)."""
    from .saved_plan import apply_saved_plan

    return apply_saved_plan(plan_file, model, signer=signer_of(sign),
                            trust=trust_of(require_signed_base), **kwargs)


def apply_stacked(recipes: list, model: str | os.PathLike, *, out: str | os.PathLike,
                  force: bool = False, params: dict[str, dict] | None = None,
                  sign=None, link: str = "auto") -> Path:
    """Apply ``recipes`` one after the other into one variant at ``out`` that appears whole or
    not at all: the first out of place into a scratch directory beside ``out``, the others
    stacked on it in place (each a revertible patch: ``revert`` undoes them one by one), then
    the scratch directory renamed to ``out``. A recipe that refuses (a guard, a bad input)
    raises its error and leaves nothing: ``out`` is as it was. ``params``: recipe -> its params.
    ``force`` replaces an earlier variant at ``out``, or an earlier stacked output of this
    same base (never a directory patched in place on another base). ``sign`` and ``link`` as
    for ``apply`` (the scratch directory is signed before it becomes ``out``)."""
    from .execute.locking import lock_new_path
    from .execute.output_dir import (
        commit,
        refuse_to_replace_a_stranger,
        remove_stale_staging,
        scratch_beside,
    )
    from .fsops import remove_tree

    out, params = Path(out), params or {}
    signer = signer_of(sign)
    with lock_new_path(out):
        remove_stale_staging(out)
        if os.path.lexists(out):
            if not force:
                raise InputError("output already exists", where=out,
                                 hint="force=True replaces it")
            refuse_to_replace_a_stranger(out, stacked_on=Path(model))
        scratch = scratch_beside(out)
        try:
            apply(recipes[0], model, out=scratch, params=params.get(recipes[0]), link=link)
            for recipe in recipes[1:]:
                apply_in_place(recipe, scratch, params=params.get(recipe))
            if signer is not None:
                from .signing.sign import sign_directory

                sign_directory(scratch, signer, name=out.name)
            commit(scratch, out)
        finally:
            if os.path.lexists(scratch):
                remove_tree(scratch)
    return out


def verify(directory: str | os.PathLike, *, jobs: int | None = None, fast: bool = False,
           on_progress=None, on_total=None, executor: str = "local",
           ray_address: str | None = None):
    """Rehash ``directory`` against its provenance manifest; returns a ``VerifyReport``.
    ``executor`` and ``ray_address`` as for ``apply``."""
    from .execute.locking import lock_directory
    from .gguf.readback import check_layouts
    from .gguf.single_file import model_directory
    from .integrity.verify import verify_dir

    directory = model_directory(directory)
    recovered(directory)
    # Shared: verifies and out-of-place applies read together; an in-place apply or a revert
    # (exclusive) cannot change the files while they are hashed.
    with lock_directory(Path(directory), exclusive=False), executing(executor, ray_address):
        report = verify_dir(Path(directory), jobs=jobs, fast=fast, on_progress=on_progress,
                            on_total=on_total)
        return check_layouts(Path(directory), report)


def apply_into_cache(recipe: str | os.PathLike | Recipe, model: str | os.PathLike, name: str,
                     *, force: bool = False, **options) -> ApplyResult:
    """Apply ``recipe`` to the Hugging Face cache snapshot ``model`` and keep the variant as
    the revision ``name`` of the same cache repository (``patcher.execute.cache_revision``):
    ``from_pretrained(repo, revision=name)`` and ``snapshot_download(..., revision=name)`` load
    it offline, and its unchanged files share the base's blobs. ``force`` repoints an existing
    ``refs/<name>``. ``options`` are :func:`apply`'s (``out`` excepted). The result's ``output``
    is the new snapshot directory."""
    import shutil
    import tempfile

    from .execute.cache_revision import cache_repository, commit_into_cache, ref_path
    from .execute.locking import lock_directory

    if options.get("sign") is not None:
        raise InputError("--sign excludes --into-cache: a cache revision's files are links "
                         "to its blobs", hint="sign a variant directory (-o OUT)")
    model = resolve_model(model, endpoint=options.get("endpoint"), progress=False)
    repo = cache_repository(model)
    ref_path(repo, name, force=force)          # refused before any work
    with lock_directory(repo, exclusive=True):
        staging = Path(tempfile.mkdtemp(prefix=".modelpatch-", dir=repo))
        try:
            result = apply(recipe, model, out=staging / "variant", **options)
            snapshot = commit_into_cache(result.output, Path(model),
                                         ref_path(repo, name, force=force))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return replace(result, output=snapshot)


def apply_in_place(recipe: str | os.PathLike | Recipe, model: str | os.PathLike, *,
                   options: PlanOptions | dict | None = None, progress: Progress | None = None,
                   base_model: str | None = None, allow_noop: bool = False,
                   endpoint: str | None = None, **given) -> ApplyResult:
    """Apply ``recipe`` to ``model`` itself, revertibly (``revert``); ``options`` (always in
    place), ``given``, ``base_model`` and ``endpoint`` as for ``apply``. A plan that changes
    nothing raises ``NothingToChange`` unless ``allow_noop``."""
    from .execute.inplace import apply_locked, prepare_directory
    from .execute.locking import lock_directory
    from .gguf.single_file import check_in_place, is_gguf_file
    from .plan import PlanOptions

    options = PlanOptions.of(options, **given, in_place=True)
    if options.executor != "local":
        raise InputError(f"--executor {options.executor} writes a new variant; it excludes "
                         f"--in-place")
    loaded, base_model = load(recipe), _checked_base_model(base_model)
    model, _ = local_model(model, None, loaded.name, endpoint=endpoint, in_place=True)
    if is_gguf_file(model):
        check_in_place(model)
        model = Path(model).parent
    # Planned once, under the exclusive lock: nothing can change the directory in between.
    with lock_directory(Path(model), exclusive=True):
        prepare_directory(Path(model))
        base = open_local(model)
        the_plan = _make_plan(loaded, base, options, endpoint, allow_noop=allow_noop)
        return apply_locked(the_plan, base, progress=progress, base_model=base_model)


def _checked_base_model(value: str | None) -> str | None:
    from .model.base_identity import check_repo_id

    return None if value is None else check_repo_id(value)


def _make_plan(recipe: Recipe, base, options: PlanOptions, endpoint: str | None, *,
               allow_noop: bool | None = None) -> Plan:
    """``recipe`` planned on ``base`` (``from: hf://`` contents fetched from ``endpoint``). For
    an apply (``allow_noop`` given): a plan that changes nothing is refused unless
    ``allow_noop``, and its warnings go to stderr as ``plan`` prints them (``-q`` silences them)."""
    from .plan import plan, require_change
    from .remote.sources import SourceFetcher

    the_plan = plan(recipe, base, options=options, sources=SourceFetcher(endpoint))
    if allow_noop is not None:
        require_change(the_plan, allow_noop)
        for warning in the_plan.warnings:
            log.warning("warning: %s", warning)
    return the_plan


def revert(directory: str | os.PathLike, *, out: str | os.PathLike | None = None,
           all_patches: bool = False, ignore_changes: bool = False, force: bool = False,
           jobs: int | None = None, executor: str = "local", ray_address: str | None = None):
    """Undo the last patch (or all with ``all_patches``): in place, or rebuilt into ``out``
    (``executor``, ``ray_address`` as for ``apply``; ``force`` replaces an earlier rebuild of
    the same base there). ``ignore_changes``: revert a changed directory or damaged data anyway."""
    from .execute.revert import rebuild_base
    from .execute.revert import revert as revert_here
    from .gguf.single_file import model_directory

    directory = model_directory(directory)
    recovered(directory)
    if out is not None:
        with executing(executor, ray_address):
            return rebuild_base(directory, out, all_patches=all_patches,
                                ignore_changes=ignore_changes, force=force, jobs=jobs)
    if executor != "local":
        raise InputError(f"--executor {executor} rebuilds the base into a new directory: "
                         f"give -o", where=directory)
    return revert_here(directory, all_patches=all_patches, ignore_changes=ignore_changes,
                       jobs=jobs)


def doctor(model: str | os.PathLike, *, engine: str | None = None, gpu: str | None = None,
           rules: tuple[str, ...] = (), endpoint: str | None = None,
           allow_recipe_files: bool = False) -> DoctorReport:
    """The ``doctor`` report of ``model`` (a directory or ``hf://org/name[@rev]``, read without
    its tensor data) for ``engine`` (``vllm==0.15.1``; no version: the installed one) on ``gpu``
    (``sm120``, ``auto``), with the built-in rules and those in the directories ``rules``
    (whose ``fix.recipe`` may name a recipe file only with ``allow_recipe_files``): a
    ``patcher.doctor.report.DoctorReport`` (``findings``, ``blockers``, ``to_json()``)."""
    from .doctor.diagnose import diagnose
    from .doctor.rules import load_rules
    from .doctor.target import Target, parse_engine, parse_gpu

    ref, target = ModelRef.parse(model), Target(*parse_engine(engine), parse_gpu(gpu))
    loaded = load_rules(tuple(rules), allow_recipe_files=allow_recipe_files)
    opened = open_model(model, endpoint=endpoint, what="doctor")
    require_model(opened)
    report = diagnose(opened, target, loaded)
    if ref.is_hub:
        return replace(report, remote=opened.transfer_report())
    return replace(report, model=os.path.abspath(model))    # as given (a .gguf file), absolute


def publish(directory: str | os.PathLike, repo_id: str, *, base: bool = False, **kwargs):
    """Verify and upload a variant in one commit (see ``hub.client.publish.publish``); with
    ``base``, a plain model and its files' sha256 (``hub.client.base_repo.publish_base``)."""
    from .gguf.single_file import model_directory
    from .hub.client.base_repo import publish_base
    from .hub.client.publish import publish as run

    directory = model_directory(directory)
    recovered(directory)
    return (publish_base if base else run)(directory, repo_id, **kwargs)


def pull(repo_id: str, out: str | os.PathLike | None = None, **kwargs):
    """Download and verify a published variant (see ``hub.client.pull.pull``)."""
    from .hub.client.pull import pull as run

    return run(repo_id, out, **kwargs)


sign = signatures.sign                       # the API's own, in patcher.signatures
verify_signature = signatures.verify_signature
