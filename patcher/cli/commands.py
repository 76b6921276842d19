"""The ``modelpatch`` command line: a thin layer over the library API.

Results go to stdout (``--json`` for machines); progress and logs go to stderr. Every
``PatchError`` becomes ``modelpatch: error: ...`` and its exit code (``group``, rendered by
``error_report``); ``--debug``, ``-q`` and ``--json`` go before or after the subcommand.
"""

from __future__ import annotations

import json
import logging
import sys

import click

from .. import __version__
from .error_report import FlagWording
from .group import (DEBUG_HELP, JSON_HELP, QUIET_HELP, ModelpatchGroup, add_shared_options,
                    set_debug, set_json, set_quiet)
from ..tensors.thread_budget import quiet_openmp


quiet_option = click.option("-q", "--quiet", is_flag=True, expose_value=False,
                            callback=set_quiet, help=QUIET_HELP)


def _emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


@click.group(cls=ModelpatchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="modelpatch")
@click.option("--debug", count=True, envvar="MODELPATCH_DEBUG", expose_value=False,
              callback=set_debug, help=DEBUG_HELP)
@click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=set_quiet,
              help=QUIET_HELP)
@click.option("--json", is_flag=True, expose_value=False, callback=set_json, help=JSON_HELP)
@click.pass_context
def main(ctx: click.Context) -> None:
    """Declarative, verifiable, reversible patches for model checkpoints."""
    quiet = ctx.ensure_object(dict).get("quiet")
    quiet_openmp()          # before anything imports torch (patcher.thread_budget)
    logging.basicConfig(level=logging.ERROR if quiet else logging.WARNING,
                        format="modelpatch: %(message)s", stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, FlagWording) for f in handler.filters):
            handler.addFilter(FlagWording())
    logging.getLogger("modelpatch").setLevel(logging.ERROR if quiet else logging.INFO)


endpoint_option = click.option(
    "--endpoint", default=None, envvar="HF_ENDPOINT",
    help="Hub URL for hf://ORG/NAME[@REV] models (default: huggingface.co, or $HF_ENDPOINT).")


@main.command()
@click.argument("model", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@endpoint_option
def inspect(model: str, as_json: bool, endpoint: str | None) -> None:
    """Report architectures, quantization, tensors, shards and index health of MODEL (a
    directory, one .gguf file, or hf://ORG/NAME[@REV]: only its JSON files and safetensors
    headers are fetched)."""
    from .. import api
    from .render import render_inspect

    report = api.inspect(model, endpoint=endpoint)
    if as_json:
        _emit_json(report)
    elif report.get("format") == "gguf" or report.get("gguf"):
        from .render_gguf import render_gguf_report

        click.echo(render_gguf_report(report))
    else:
        click.echo(render_inspect(report))
        _echo_transfer(report.get("remote"))


def _echo_transfer(remote: dict | None) -> None:
    if remote is not None:
        from ..remote.model import describe_transfer

        click.echo(describe_transfer(remote))


def _plan_options(in_place: bool, link: str, jobs: int | None, device: str,
                  max_shard_size: int | None, params: dict | None = None) -> dict:
    return {"in_place": in_place, "link": link, "jobs": jobs, "device": device,
            "max_shard_size": max_shard_size, **({"params": params} if params else {})}


def _set_values(items: tuple[str, ...]) -> dict[str, str]:
    """``--set NAME=VALUE`` options as a dict (typed later, by each parameter's type)."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise click.UsageError(f"--set {item!r}: write --set NAME=VALUE")
        out[name.strip()] = value
    return out


set_option = click.option(
    "--set", "set_values", multiple=True, metavar="NAME=VALUE",
    help="A value for a recipe parameter (see `modelpatch recipes show`), typed by the "
         "parameter's declared type; repeatable.")


base_model_option = click.option(
    "--base-model", default=None, metavar="ORG/NAME",
    help="The hub repository the base model is, for the model card's base_model (read from a "
         "Hugging Face cache path or the base's manifest when not given; never guessed).")

link_option = click.option(
    "--link", "link", type=click.Choice(["auto", "reflink", "hardlink", "copy"]), default=None,
    help="How to carry the base's unchanged files: reflink, else hardlink (the variant's file "
         "IS the base's), else copy (auto, the default); reflink or hardlink fail rather than "
         "fall back; copy gives independent files.")


class ShardSize(click.ParamType):
    """``5GB``, ``500MB``, ``2GiB`` or a byte count, as bytes."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        from ..tensors.resharding import parse_shard_size

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
    remote = the_plan.options.get("remote")
    if remote is not None and as_json:
        data["remote"] = remote
    click.echo(json.dumps(data, indent=2) if as_json else render_plan(data))
    if not as_json:
        _echo_transfer(remote)
    require_change(the_plan, allow_noop)


@main.command()
@click.argument("recipe", nargs=-1, required=True)
@click.argument("model", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan.")
@click.option("--device", default="cpu", show_default=True, help="Device for tensor kernels.")
@max_shard_size_option
@allow_noop_option
@click.option("-o", "--output", "out", type=click.Path(path_type=str), default=None,
              help="Where apply would write the variant (predicts linking vs copying there).")
@link_option
@endpoint_option
@set_option
def plan(recipe: tuple[str, ...], model: str, as_json: bool, device: str,
         max_shard_size: int | None, allow_noop: bool, out: str | None, link: str | None,
         endpoint: str | None, set_values: tuple[str, ...]) -> None:
    """Show what applying RECIPE (one or more, in order) to MODEL would do (same as apply
    --dry-run). MODEL may be hf://ORG/NAME[@REV]: planned from its JSON files and safetensors
    headers alone; or one .gguf file."""
    from .. import api

    options = _plan_options(False, link or "auto", None, device, max_shard_size,
                            _set_values(set_values))
    the_plan = api.plan(list(recipe), model, options=options, out=out, endpoint=endpoint)
    _show_plan(the_plan, as_json, allow_noop)


@main.command()
@click.argument("recipe", nargs=-1, required=True)
@click.argument("model")
@click.option("-o", "--output", "out", type=click.Path(path_type=str), default=None,
              help="Where to write the variant (default: <model>-<recipe name> beside the "
                   "model; for a Hugging Face cache snapshot, in the current directory).")
@click.option("--in-place", is_flag=True, help="Patch MODEL itself (revertible).")
@click.option("--dry-run", is_flag=True, help="Print the plan and write nothing.")
@click.option("--force", is_flag=True,
              help="Replace an existing output that is an earlier modelpatch variant.")
@click.option("--copy", "force_copy", is_flag=True, help="Same as --link copy.")
@link_option
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes for rewritten shards, each with cores/N torch threads "
                   "(default: half the cores when tensors are computed, all for copies); "
                   "hashing threads.")
@click.option("--device", default="cpu", show_default=True, help="Device for tensor kernels.")
@max_shard_size_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@allow_noop_option
@base_model_option
@click.option("--publish", "publish_to", default=None, metavar="REPO_ID",
              help="With MODEL hf://ORG/NAME and a config-only recipe: publish the variant to "
                   "REPO_ID without downloading the shards (they are copied server-side).")
@endpoint_option
@set_option
@quiet_option
@click.pass_context
def apply(ctx, recipe, model, out, in_place, dry_run, force, force_copy, link, jobs, device,
          max_shard_size, as_json, allow_noop, base_model, publish_to, endpoint, set_values):
    """Apply RECIPE (a path or a built-in name; several are applied in order as one) to MODEL
    and write a verified variant. For MODEL a .gguf file, the variant is the directory OUT
    (default: <file>-<recipe> beside it) holding the new file and its manifest."""
    from .. import api
    from .render import recipe_source

    if in_place and out:
        raise click.UsageError("--in-place and -o/--output exclude each other")
    if publish_to is not None:
        _apply_and_publish(list(recipe), model, publish_to, endpoint, as_json, allow_noop,
                           base_model, _set_values(set_values),
                           conflicting=in_place or out or dry_run or max_shard_size)
        return
    if force_copy and link not in (None, "copy"):
        raise click.UsageError(f"--copy is --link copy; it excludes --link {link}")
    link = "copy" if force_copy else link or "auto"
    recipe = api.load(list(recipe))
    params = _set_values(set_values)
    if model.startswith(api.HF_SCHEME):
        resolved = api.resolve_model(model, endpoint=endpoint, progress=not ctx.obj.get("quiet"))
        if out is None and not in_place:       # never write beside a cache snapshot
            out = f"{model[len(api.HF_SCHEME):].split('@')[0].split('/')[-1]}-" \
                  f"{recipe.name}"
        model = str(resolved)
    if dry_run:
        options = _plan_options(in_place, link, jobs, device, max_shard_size, params)
        _show_plan(api.plan(recipe, model, options=options, out=out), as_json, allow_noop)
        return
    if not ctx.obj.get("quiet") and sys.stderr.isatty():   # like the progress bars
        click.echo(recipe_source(recipe.identity()), err=True)
    from .progress import Meters

    with Meters(bool(ctx.obj.get("quiet"))) as meters:
        progress = meters.engine_progress()
        if in_place:
            result = api.apply_in_place(recipe, model, jobs=jobs, device=device,
                                        max_shard_size=max_shard_size, progress=progress,
                                        base_model=base_model, allow_noop=allow_noop,
                                        params=params)
        else:
            result = api.apply(recipe, model, out=out, force=force, link=link,
                               jobs=jobs, device=device, max_shard_size=max_shard_size,
                               progress=progress, base_model=base_model,
                               allow_noop=allow_noop, params=params)
    if as_json:
        _emit_json({"output": str(result.output), "recipe": recipe.identity(),
                    "manifest_sha256": result.manifest_sha256,
                    "files": result.files, "bytes_linked": result.bytes_linked,
                    "bytes_copied": result.bytes_copied,
                    "bytes_written": result.bytes_written, "bytes_hashed": result.bytes_hashed,
                    "link_method": result.link_method})
    else:
        click.echo(str(result.output))


def _apply_and_publish(recipe, model, repo_id, endpoint, as_json, allow_noop, base_model,
                       params, conflicting) -> None:
    from ..hub.client.remote_apply import apply_and_publish

    if not model.startswith("hf://"):
        raise click.UsageError("--publish needs MODEL as hf://ORG/NAME[@REV]; for a local "
                               "variant run `modelpatch publish`")
    if conflicting:
        raise click.UsageError("--publish excludes --in-place, -o/--output, --dry-run and "
                               "--max-shard-size")
    r = apply_and_publish(recipe, model, repo_id, endpoint=endpoint, base_model=base_model,
                          allow_noop=allow_noop, params=params)
    if as_json:
        _emit_json({"repo_id": r.repo_id, "revision": r.revision, "commit": r.commit,
                    "fetched": r.fetched, "copied_bytes": r.plan.copy_bytes,
                    "uploaded_bytes": r.plan.upload_bytes})
    else:
        click.echo(f"fetched: {', '.join(r.fetched) or 'nothing'}")
        click.echo(f"{r.repo_id}@{r.revision} {r.commit}")


@main.command()
@click.argument("directory", type=click.Path(path_type=str))
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel hashing workers (default: all cores).")
@click.option("--fast", is_flag=True,
              help="Trust digests modelpatch cached after a full verification of the same "
                   "unchanged files (device, inode, size, mtime, ctime).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@quiet_option
@click.pass_context
def verify(ctx, directory, jobs, fast, as_json):
    """Rehash DIRECTORY against its provenance manifest. Exit 1 on any mismatch. A .gguf file
    stands for the directory holding it."""
    from .. import api
    from .render import render_verify

    from .progress import Meters

    with Meters(bool(ctx.obj.get("quiet"))) as meters:
        meter = meters.meter("verifying")
        report = api.verify(directory, jobs=jobs, fast=fast, on_progress=meter.update,
                            on_total=meter.set_total)
    data = report.as_dict()
    click.echo(json.dumps(data, indent=2) if as_json else render_verify(data))
    if not report.ok:
        ctx.exit(1)


@main.command()
@click.argument("directory", type=click.Path(path_type=str))
@click.option("-o", "--output", "out", type=click.Path(path_type=str), default=None,
              help="Rebuild the base into OUT instead of reverting DIRECTORY in place.")
@click.option("--all", "all_patches", is_flag=True, help="Revert every patch, back to the original.")
@click.option("--force", is_flag=True, help="Revert even if DIRECTORY changed since the patch.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel hashing workers (default: all cores).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def revert(directory, out, all_patches, force, jobs, as_json):
    """Undo the last patch of DIRECTORY (byte-identical, symlinks restored). A .gguf file
    stands for the directory holding it."""
    from .. import api

    result = api.revert(directory, out=out, all_patches=all_patches, force=force, jobs=jobs)
    if as_json:
        _emit_json({"output": str(result.output), "reverted": result.reverted})
    else:
        click.echo(f"reverted {', '.join(result.reverted)}: {result.output}")


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.argument("repo_id")
@click.option("--endpoint", default=None, envvar="HF_ENDPOINT",
              help="Hub URL (default: huggingface.co, or $HF_ENDPOINT).")
@click.option("--private/--public", default=True, show_default=True,
              help="Visibility of the repository if publish creates it.")
@click.option("--revision", default=None, help="Branch to commit to (created if needed).")
@click.option("-m", "--message", default=None, help="Commit message.")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable result (repo_id, revision, commit, files, copied_bytes, "
                   "uploaded_bytes).")
@click.option("--plan", "plan_only", is_flag=True,
              help="Only show what would be copied server-side from the base repository and "
                   "what uploaded; change nothing.")
@base_model_option
@quiet_option
@click.pass_context
def publish(ctx, directory, repo_id, endpoint, private, revision, message, as_json, plan_only,
            base_model):
    """Verify the variant DIRECTORY and upload it to REPO_ID in one commit. Files its base
    repository on the hub already holds are copied there server-side, not uploaded."""
    from .. import api
    from . import render

    r = api.publish(directory, repo_id, endpoint=endpoint, private=private, revision=revision,
                    message=message, progress=not ctx.obj.get("quiet"), base_model=base_model,
                    plan_only=plan_only)
    if as_json:
        _emit_json({"repo_id": r.repo_id, "revision": r.revision, "commit": r.commit,
                    "files": r.files, "copied_bytes": r.plan.copy_bytes,
                    "uploaded_bytes": r.plan.upload_bytes})
    elif plan_only:
        click.echo(f"plan: {r.plan.summary()}")
        for name, (src, size) in sorted(r.plan.copies.items()):
            click.echo(f"  copy    {name} ({render.human_bytes(size)}) <- {src}")
        for name, size in sorted(r.plan.uploads.items()):
            click.echo(f"  upload  {name} ({render.human_bytes(size)})")
    else:
        click.echo(f"{r.repo_id}@{r.revision} {r.commit}")


@main.command()
@click.argument("repo_id")
@click.option("-o", "--output", "out", type=click.Path(path_type=str), default=None,
              help="Directory to create (default: ./<name>).")
@click.option("--endpoint", default=None, envvar="HF_ENDPOINT",
              help="Hub URL (default: huggingface.co, or $HF_ENDPOINT).")
@click.option("--revision", default=None, help="Branch, tag or commit.")
@click.option("--reuse", "reuse", multiple=True, type=click.Path(file_okay=False, path_type=str),
              help="Directory whose files to link instead of downloading when their sha256 "
                   "matches (repeatable; the Hugging Face cache is always searched).")
@quiet_option
@click.pass_context
def pull(ctx, repo_id, out, endpoint, revision, reuse):
    """Download REPO_ID and verify every file against the hub's digests and the manifest."""
    from .. import api

    result = api.pull(repo_id, out, endpoint=endpoint, revision=revision,
                      progress=not ctx.obj.get("quiet"), reuse=reuse)
    click.echo(str(result.output))


@main.group()
def hub() -> None:
    """A self-hosted hub speaking the Hugging Face Hub API (needs the hub extra)."""


@hub.command("serve")
@click.option("--root", required=True, type=click.Path(file_okay=False, path_type=str),
              help="Storage directory (blobs, repositories, tokens.json).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port to listen on (0: any free port).")
def hub_serve(root, host, port):
    """Serve repositories stored under ROOT until interrupted."""
    try:
        from ..hub.server.app import serve
    except ImportError as exc:
        raise click.ClickException(f"the hub server needs its extra: pip install -e '.[hub]' "
                                   f"in the modelpatch checkout ({exc.name} is missing)") from None
    from pathlib import Path

    serve(Path(root), host=host, port=port)


@main.group()
def recipes() -> None:
    """List and show the built-in recipes."""


@recipes.command("list")
def recipes_list() -> None:
    """List the built-in recipes with their descriptions."""
    import shutil

    from ..recipe.load import builtin_recipe_dir, load_recipe
    from .render import shorten

    width = shutil.get_terminal_size().columns       # $COLUMNS, the terminal, else 80
    for path in sorted(builtin_recipe_dir().glob("*.yaml")):
        recipe = load_recipe(path)
        click.echo(f"{recipe.name:<22} {shorten(recipe.description, width - 23)}")
        if recipe.params:
            params = " ".join(f"{p.name}={_param_default(p)}" for p in recipe.params)
            click.echo(" " * 23 + shorten(f"--set {params}", width - 23))


def _param_default(param) -> str:
    from ..recipe.schema import REQUIRED

    return "REQUIRED" if param.default is REQUIRED else json.dumps(param.default)


@recipes.command("show")
@click.argument("name")
def recipes_show(name: str) -> None:
    """Print the built-in recipe NAME (or a recipe file), then its parameters."""
    from ..recipe.load import load_recipe, resolve_recipe

    path = resolve_recipe(name)
    click.echo(path.read_text(encoding="utf-8"), nl=False)
    params = load_recipe(path).params
    if params:
        click.echo("\n# Parameters (apply/plan --set NAME=VALUE):")
    for p in params:
        click.echo(f"#   {p.name} ({p.type}, default {_param_default(p)}): {p.description}")


from ..doctor.command import doctor  # noqa: E402  (its own module; click only)

main.add_command(doctor)

add_shared_options(main)     # after every command: --debug, -q and --json after the subcommand

if __name__ == "__main__":
    main()
