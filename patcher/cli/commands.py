"""The ``modelpatch`` command line: a thin layer over the library API.

Results go to stdout (``--json`` for machines); progress and logs go to stderr. Every
``PatchError`` becomes ``modelpatch: error: ...`` and its exit code (``group``, rendered by
``error_report``); ``--debug``, ``-q`` and ``--json`` go before or after the subcommand.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from .. import __version__, collector
from ..tensors.writing.thread_budget import quiet_openmp
from .error_report import FlagWording
from .group import (
    DEBUG_HELP,
    JSON_HELP,
    QUIET_HELP,
    ModelpatchGroup,
    add_shared_options,
    base_model_option,
    emit_json,
    executor_options,
    quiet_option,
    refuse_in_place,
    set_debug,
    set_json,
    set_quiet,
)
from .options import (
    endpoint_option,
    force_option,
    jobs_option,
    json_option,
    link_mode,
    link_options,
    output_option,
)
from .output import echo, echo_json, escape_log_lines
from .sign_commands import (
    require_signed_base_option,
    sign_options,
    signer_from,
    verify_options,
)

LOG_FORMAT = "modelpatch: %(message)s"


@click.group(cls=ModelpatchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="modelpatch")
@click.option("--debug", count=True, envvar="MODELPATCH_DEBUG", expose_value=False,
              callback=set_debug, help=DEBUG_HELP)
@click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=set_quiet,
              help=QUIET_HELP)
@click.option("--json", "as_json", is_flag=True, expose_value=False, callback=set_json,
              help=JSON_HELP)
@click.pass_context
def main(ctx: click.Context) -> None:
    """Declarative, verifiable, reversible patches for model checkpoints."""
    quiet = ctx.ensure_object(dict).get("quiet")
    quiet_openmp()          # before anything imports torch (patcher.thread_budget)
    collector.ONE_COMMAND = True     # one command per process
    logging.basicConfig(level=logging.ERROR if quiet else logging.WARNING,
                        format=LOG_FORMAT, stream=sys.stderr)
    escape_log_lines(LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, FlagWording) for f in handler.filters):
            handler.addFilter(FlagWording())
    logging.getLogger("modelpatch").setLevel(logging.ERROR if quiet else logging.INFO)


@main.command()
@click.argument("model", type=click.Path(path_type=str))
@json_option("Machine-readable report.")
@endpoint_option()
def inspect(model: str, as_json: bool, endpoint: str | None) -> None:
    """Report architectures, quantization, tensors, shards and index health of MODEL (a
    directory, one .gguf file, or hf://ORG/NAME[@REV]: only its JSON files and safetensors
    headers are fetched)."""
    from .. import api
    from .render import render_inspect

    report = api.inspect(model, endpoint=endpoint)
    if as_json:
        emit_json(report.to_json())
    elif report.format == "gguf" or report.gguf:
        from .render import render_gguf_report

        echo(render_gguf_report(report))
    else:
        echo(render_inspect(report))
        _echo_transfer(report.remote)


def _echo_transfer(remote: dict | None) -> None:
    if remote is not None:
        from ..remote.model import describe_transfer

        echo(describe_transfer(remote))


def _set_values(items: tuple[str, ...]) -> dict[str, str]:
    """``--set NAME=VALUE`` options as a dict (typed later, by each parameter's type)."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise click.UsageError(f"--set {item!r}: write --set NAME=VALUE")
        if name.strip() in out and out[name.strip()] != value:
            raise click.UsageError(f"--set {name.strip()} given twice ({out[name.strip()]!r} "
                                   f"and {value!r}): give it once")
        out[name.strip()] = value
    return out


set_option = click.option(
    "--set", "set_values", multiple=True, metavar="[RECIPE.]NAME=VALUE",
    help="A value for a recipe parameter (see `modelpatch recipes show`), typed by the "
         "parameter's declared type; RECIPE.NAME=VALUE gives it to one of several recipes; "
         "repeatable.")


class ShardSize(click.ParamType):
    """``5GB``, ``500MB``, ``2GiB`` or a byte count, as bytes."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        from ..units import parse_shard_size

        try:
            return parse_shard_size(int(value) if str(value).isdigit() else value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


max_shard_size_option = click.option(
    "--max-shard-size", type=ShardSize(), default=None,
    help="Reshard the variant into shards of at most SIZE (5GB, 500MB, 2GiB), as transformers' "
         "save_pretrained does; overrides the recipe's output.max_shard_size.")


allow_noop_option = click.option(
    "--allow-noop", is_flag=True,
    help="Accept a plan that changes nothing (by default it fails with exit code 1).")


def _show_plan(the_plan, as_json: bool, allow_noop: bool) -> None:
    from ..plan import require_change
    from .render import render_plan

    data = the_plan.to_json()
    remote = the_plan.transfer
    if remote is not None and as_json:
        data["remote"] = remote
    if as_json:
        echo_json(data)
    else:
        echo(render_plan(data))
    if not as_json:
        _echo_transfer(remote)
    require_change(the_plan, allow_noop)


@main.command()
@click.argument("recipe", nargs=-1, required=True)
@click.argument("model", type=click.Path(path_type=str))
@json_option("Machine-readable plan.")
@click.option("--device", default="cpu", show_default=True, help="Device for tensor kernels.")
@max_shard_size_option
@allow_noop_option
@output_option("Where apply would write the variant (predicts linking vs copying there).")
@link_options
@endpoint_option()
@set_option
@click.option("--save", "save_to", type=click.Path(path_type=str), default=None,
              metavar="PLAN.json",
              help="Also write the plan to PLAN.json: `modelpatch apply PLAN.json` then carries "
                   "out exactly it, or refuses if the model changed since.")
def plan(recipe: tuple[str, ...], model: str, as_json: bool, device: str,
         max_shard_size: int | None, allow_noop: bool, out: str | None, link: str | None,
         force_copy: bool, endpoint: str | None, set_values: tuple[str, ...],
         save_to: str | None) -> None:
    """Show what applying RECIPE (one or more, in order) to MODEL would do (same as apply
    --dry-run). MODEL may be hf://ORG/NAME[@REV]: planned from its JSON files and safetensors
    headers alone; or one .gguf file."""
    from .. import api
    from ..plan import PlanOptions

    options = PlanOptions.of(link=link_mode(link, force_copy), device=device,
                             max_shard_size=max_shard_size, params=_set_values(set_values))
    the_plan = api.plan(list(recipe), model, options=options, out=out, endpoint=endpoint)
    _show_plan(the_plan, as_json, allow_noop)
    if save_to is not None:
        api.save_plan(the_plan, save_to)
        echo(f"plan saved: {os.path.abspath(save_to)} (apply it with `modelpatch apply "
             f"{save_to}`)", err=True)


@main.command()
@click.argument("recipe", nargs=-1)
@click.argument("model")
@output_option("Where to write the variant (default: <model>-<recipe name> beside the model; "
               "for a Hugging Face cache snapshot, in the current directory).")
@click.option("--in-place", is_flag=True, help="Patch MODEL itself (revertible).")
@click.option("--dry-run", is_flag=True, help="Print the plan and write nothing.")
@force_option()
@link_options
@jobs_option("Worker processes for rewritten shards, each with cores/N torch threads "
             "(default: half the cores when tensors are computed, all for copies); "
             "hashing threads.")
@click.option("--device", default="cpu", show_default=True, help="Device for tensor kernels.")
@max_shard_size_option
@json_option()
@allow_noop_option
@base_model_option
@click.option("--into-cache", "into_cache", default=None, metavar="NAME",
              help="With MODEL a Hugging Face cache snapshot (or hf://ORG/NAME): keep the "
                   "variant in the cache as the revision NAME of the same repository "
                   "(from_pretrained(..., revision=NAME)); its unchanged files share the base's "
                   "blobs.")
@click.option("--publish", "publish_to", default=None, metavar="REPO_ID",
              help="With MODEL hf://ORG/NAME and a config-only recipe: publish the variant to "
                   "REPO_ID without downloading the shards (they are copied server-side).")
@endpoint_option()
@set_option
@executor_options
@quiet_option
@sign_options
@require_signed_base_option
@click.pass_context
def apply(ctx, recipe, model, out, in_place, dry_run, force, link, force_copy, jobs, device,
          max_shard_size, as_json, allow_noop, base_model, into_cache, publish_to, endpoint,
          set_values, executor, ray_address, sign_key=None, base_key=None):
    """Apply RECIPE (a path or a built-in name; several are applied in order as one) to MODEL
    and write a verified variant. For MODEL a .gguf file, the variant is the directory OUT
    (default: <file>-<recipe> beside it) holding the new file and its manifest. `apply
    PLAN.json` carries out exactly a plan saved by `plan --save`."""
    from .. import api
    from .render import recipe_source
    from .saved_plan import apply_saved_plan

    if apply_saved_plan(ctx, recipe, model):
        return
    if in_place and out:
        raise click.UsageError("--in-place and -o/--output exclude each other")
    refuse_in_place(in_place, executor)
    if into_cache is not None and (in_place or out or publish_to is not None):
        raise click.UsageError("--into-cache excludes --in-place, -o/--output and --publish")
    if (sign_key or base_key) and (in_place or into_cache is not None or publish_to):
        raise click.UsageError("--sign and --require-signed-base make a variant directory: they "
                               "exclude --in-place, --into-cache and --publish (sign afterwards "
                               "with `modelpatch sign`)")
    signer = None if dry_run else signer_from(sign_key)     # a bad key fails before any work
    if publish_to is not None:
        from .hub_commands import apply_and_publish

        apply_and_publish(list(recipe), model, publish_to, endpoint, as_json, allow_noop,
                           base_model, _set_values(set_values),
                           conflicting=in_place or out or dry_run or max_shard_size)
        return
    from ..model_ref import ModelRef
    from ..plan import PlanOptions

    options = PlanOptions.of(in_place=in_place, link=link_mode(link, force_copy), jobs=jobs,
                             device=device, max_shard_size=max_shard_size,
                             params=_set_values(set_values), executor=executor,
                             ray_address=ray_address)
    recipe = api.load(list(recipe))
    ref = ModelRef.parse(model)
    if ref.is_hub:
        from .progress import resolve_with_meter

        resolved = resolve_with_meter(ref, endpoint, bool(ctx.obj.get("quiet")))
        if out is None and not in_place and into_cache is None:   # never beside a snapshot
            out = f"{ref.name}-{recipe.name}"
        model = str(resolved)
    if dry_run:
        _show_plan(api.plan(recipe, model, options=options, out=out, endpoint=endpoint),
                   as_json, allow_noop)
        return
    for line in recipe_source(recipe.identity()).splitlines():    # which file ran, -q aside
        logging.getLogger("modelpatch").info("%s", line)
    from .progress import Meters

    with Meters(bool(ctx.obj.get("quiet"))) as meters:
        shared = {"options": options, "progress": meters.engine_progress(),
                  "base_model": base_model, "allow_noop": allow_noop, "endpoint": endpoint}
        if in_place:
            result = api.apply_in_place(recipe, model, **shared)
        elif into_cache is not None:
            result = api.apply_into_cache(recipe, model, into_cache, force=force, **shared)
        else:
            result = api.apply(recipe, model, out=out, force=force, sign=signer,
                               require_signed_base=base_key, **shared)
    if as_json:
        emit_json({"output": str(result.output), "recipe": recipe.identity(),
                    "manifest_sha256": result.manifest_sha256,
                    "files": result.files, "bytes_linked": result.bytes_linked,
                    "bytes_copied": result.bytes_copied,
                    "bytes_written": result.bytes_written, "bytes_hashed": result.bytes_hashed,
                    "link_method": result.link_method})
    else:
        echo(os.path.abspath(result.output))      # in place too: the path as given


@main.command()
@click.argument("directory", type=click.Path(path_type=str))
@jobs_option()
@click.option("--fast", is_flag=True,
              help="Trust digests modelpatch cached after a full verification of the same "
                   "unchanged files (device, inode, size, mtime, ctime).")
@json_option("Machine-readable report.")
@executor_options
@quiet_option
@verify_options
@click.pass_context
def verify(ctx, directory, jobs, fast, as_json, executor, ray_address, **signature):
    """Rehash DIRECTORY against its provenance manifest. Exit 1 on any mismatch. A .gguf file
    stands for the directory holding it. With --key (--cert-chain, --identity): check its
    model.sig first, then every file against the signature."""
    from .. import api
    from .progress import Meters
    from .render import render_verify
    from .sign_commands import signature_checked, signed_only, verify_signature

    with Meters(bool(ctx.obj.get("quiet"))) as meters:
        meter = meters.meter("verifying")
        signed = verify_signature(directory, fast=fast, jobs=jobs, on_progress=meter.update,
                                  **signature)
        if signed_only(directory, signature):       # a signed model without a manifest
            echo_json({"ok": True, "signature": signed}) if as_json else echo("\n".join(signed))
            return
        # After a signature check every file was just hashed: the cache has them, verified.
        report = api.verify(directory, jobs=jobs, fast=fast or signature_checked(signature),
                            on_progress=meter.update, on_total=meter.set_total,
                            executor=executor, ray_address=ray_address)
    data = report.as_dict()
    if as_json:
        echo_json(dict(data, signature=signed) if signed else data)
    else:
        echo("\n".join([*signed, render_verify(data)]))
    if not report.ok:
        ctx.exit(1)


@main.command()
@click.argument("directory", type=click.Path(path_type=str))
@output_option("Rebuild the base into OUT instead of reverting DIRECTORY in place.")
@force_option("With -o: replace an existing OUT that is an earlier rebuild of the same base "
              "(never anything else).")
@click.option("--all", "all_patches", is_flag=True,
              help="Revert every patch, back to the original.")
@click.option("--ignore-changes", is_flag=True,
              help="Revert even if DIRECTORY changed since the patch (or its revert data is "
                   "damaged), to the recorded bytes.")
@jobs_option()
@json_option()
@executor_options
def revert(directory, out, force, all_patches, ignore_changes, jobs, as_json, executor,
           ray_address):
    """Undo the last patch of DIRECTORY (byte-identical, symlinks restored). A .gguf file
    stands for the directory holding it."""
    from .. import api

    if force and out is None:
        raise click.UsageError("--force replaces an existing output: it goes with -o OUT (to "
                               "revert a directory changed since its patch: --ignore-changes)")
    result = api.revert(directory, out=out, all_patches=all_patches, force=force,
                        ignore_changes=ignore_changes, jobs=jobs, executor=executor,
                        ray_address=ray_address)
    if as_json:
        emit_json({"output": str(result.output), "reverted": result.reverted})
    else:
        echo(f"reverted {', '.join(result.reverted)}: {result.output}")


from ..doctor.command import doctor  # noqa: E402  (its own module; click only)
from .hub_commands import hub, publish, pull  # noqa: E402
from .recipe_commands import recipes  # noqa: E402
from .sign_commands import sign  # noqa: E402

for command in (doctor, hub, publish, pull, recipes, sign):
    main.add_command(command)

add_shared_options(main)     # after every command: --debug, -q and --json after the subcommand

if __name__ == "__main__":
    main()
