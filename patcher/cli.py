"""The ``modelpatch`` command line: a thin layer over the library API.

Results go to stdout (``--json`` for machines); progress and logs go to stderr. Every
``PatchError`` becomes one line ``modelpatch: error: ...`` and its exit code; ``--debug`` (or
``MODELPATCH_DEBUG=1``) shows tracebacks instead.
"""

from __future__ import annotations

import json
import logging
import sys

import click

from . import __version__
from .errors import PatchError
from .thread_budget import quiet_openmp


class _Group(click.Group):
    """Turns modelpatch errors into one-line messages with the documented exit codes."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PatchError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                for problem in getattr(exc, "errors", None) or []:   # every recipe problem
                    click.echo(f"modelpatch: {problem}", err=True)
                raise
            click.echo(f"modelpatch: error: {exc.one_line()}", err=True)
            ctx.exit(exc.exit_code)
        except BrokenPipeError:
            # The reader of stdout went away (`modelpatch recipes list | head`): stop quietly,
            # as other command-line tools do.
            sys.stderr.close()
            ctx.exit(141)
        except OSError as exc:
            # An I/O error no layer below turned into an OperationFailed: still one line and
            # exit code 3, never a traceback (the commands leave their directories consistent
            # or journaled whatever raises).
            if ctx.obj and ctx.obj.get("debug"):
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"modelpatch: error: {where}{exc.strerror or exc}".replace("\n", " "),
                       err=True)
            ctx.exit(3)
        except KeyboardInterrupt as exc:
            # Ctrl-C: 130; SIGTERM/SIGHUP (turned into KeyboardInterrupt("signal N") so that
            # cleanup runs): 128 + N, as a shell reports a process that signal ended.
            signum = str(exc).removeprefix("signal ")
            click.echo("modelpatch: interrupted", err=True)
            ctx.exit(128 + int(signum) if signum.isdigit() else 130)


def _set_quiet(ctx: click.Context, _param, value: bool) -> bool:
    if value:
        ctx.ensure_object(dict)["quiet"] = True
        logging.getLogger().setLevel(logging.ERROR)
        logging.getLogger("modelpatch").setLevel(logging.ERROR)
    return value


quiet_option = click.option("-q", "--quiet", is_flag=True, expose_value=False,
                            callback=_set_quiet, help="No progress bars or informational logs.")


def _emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="modelpatch")
@click.option("--debug", is_flag=True, envvar="MODELPATCH_DEBUG", help="Show tracebacks.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or informational logs.")
@click.pass_context
def main(ctx: click.Context, debug: bool, quiet: bool) -> None:
    """Declarative, verifiable, reversible patches for model checkpoints."""
    ctx.obj = {"debug": debug, "quiet": quiet}
    quiet_openmp()          # before anything imports torch (patcher.thread_budget)
    logging.basicConfig(level=logging.ERROR if quiet else logging.WARNING,
                        format="modelpatch: %(message)s", stream=sys.stderr)
    logging.getLogger("modelpatch").setLevel(logging.ERROR if quiet else logging.INFO)


@main.command()
@click.argument("model", type=click.Path(file_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
def inspect(model: str, as_json: bool) -> None:
    """Report architectures, quantization, tensors, shards and index health of MODEL."""
    from . import api
    from .render import render_inspect

    report = api.inspect(model)
    if as_json:
        _emit_json(report)
    else:
        click.echo(render_inspect(report))


def _bar(ctx: click.Context, desc: str):
    """A tqdm byte counter on stderr (None when quiet). Returns (bar, update, set_total)."""
    if ctx.obj.get("quiet"):
        return None
    from tqdm import tqdm

    return tqdm(total=0, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, leave=False, disable=None)


def _progress(ctx: click.Context):
    from .engine import Progress

    bar = _bar(ctx, "hashing")
    write_bar = _bar(ctx, "writing")
    if bar is None:
        return Progress(), []

    def set_total(n: int) -> None:
        bar.total = n
        bar.refresh()

    return Progress(hashing=bar.update, writing=write_bar.update, hash_total=set_total), [bar, write_bar]


def _plan_options(in_place: bool, force_copy: bool, jobs: int | None, device: str,
                  max_shard_size: int | None) -> dict:
    return {"in_place": in_place, "force_copy": force_copy, "jobs": jobs, "device": device,
            "max_shard_size": max_shard_size}


class ShardSize(click.ParamType):
    """``5GB``, ``500MB``, ``2GiB`` or a byte count, as bytes."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        from .resharding import parse_shard_size

        try:
            return parse_shard_size(int(value) if str(value).isdigit() else value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


max_shard_size_option = click.option(
    "--max-shard-size", type=ShardSize(), default=None,
    help="Reshard the variant into shards of at most SIZE (5GB, 500MB, 2GiB), as transformers' "
         "save_pretrained does; overrides the recipe's output.max_shard_size.")


@main.command()
@click.argument("recipe")
@click.argument("model", type=click.Path(file_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan.")
@click.option("--device", default="cpu", show_default=True, help="Device for tensor kernels.")
@max_shard_size_option
def plan(recipe: str, model: str, as_json: bool, device: str, max_shard_size: int | None) -> None:
    """Show what applying RECIPE to MODEL would do (same as apply --dry-run)."""
    from . import api
    from .render import render_plan

    options = _plan_options(False, False, None, device, max_shard_size)
    data = api.plan(recipe, model, options=options).to_json()
    click.echo(json.dumps(data, indent=2) if as_json else render_plan(data))


@main.command()
@click.argument("recipe")
@click.argument("model")
@click.option("-o", "--output", "out", type=click.Path(path_type=str), default=None,
              help="Where to write the variant (default: <model>-<recipe name> beside the "
                   "model; for a Hugging Face cache snapshot, in the current directory).")
@click.option("--in-place", is_flag=True, help="Patch MODEL itself (revertible).")
@click.option("--dry-run", is_flag=True, help="Print the plan and write nothing.")
@click.option("--force", is_flag=True,
              help="Replace an existing output that is an earlier modelpatch variant.")
@click.option("--copy", "force_copy", is_flag=True, help="Copy unchanged files instead of linking.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes for rewritten shards, each with cores/N torch threads "
                   "(default: half the cores when tensors are computed, all for copies); "
                   "hashing threads.")
@click.option("--device", default="cpu", show_default=True, help="Device for tensor kernels.")
@max_shard_size_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@quiet_option
@click.pass_context
def apply(ctx, recipe, model, out, in_place, dry_run, force, force_copy, jobs, device,
          max_shard_size, as_json):
    """Apply RECIPE (a path or a built-in name) to MODEL and write a verified variant."""
    from . import api
    from .render import render_plan

    if in_place and out:
        raise click.UsageError("--in-place and -o/--output exclude each other")
    if model.startswith(api.HF_SCHEME):
        resolved = api.resolve_model(model, progress=not ctx.obj.get("quiet"))
        if out is None and not in_place:       # never write beside a cache snapshot
            out = f"{model[len(api.HF_SCHEME):].split('@')[0].split('/')[-1]}-" \
                  f"{api.load(recipe).name}"
        model = str(resolved)
    if dry_run:
        options = _plan_options(in_place, force_copy, jobs, device, max_shard_size)
        data = api.plan(recipe, model, options=options).to_json()
        click.echo(json.dumps(data, indent=2) if as_json else render_plan(data))
        return
    progress, bars = _progress(ctx)
    try:
        if in_place:
            result = api.apply_in_place(recipe, model, jobs=jobs, device=device,
                                        max_shard_size=max_shard_size, progress=progress)
        else:
            result = api.apply(recipe, model, out=out, force=force, force_copy=force_copy,
                               jobs=jobs, device=device, max_shard_size=max_shard_size,
                               progress=progress)
    finally:
        for bar in bars:
            bar.close()
    if as_json:
        _emit_json({"output": str(result.output), "manifest_sha256": result.manifest_sha256,
                    "files": result.files, "bytes_linked": result.bytes_linked,
                    "bytes_written": result.bytes_written, "bytes_hashed": result.bytes_hashed,
                    "link_method": result.link_method})
    else:
        click.echo(str(result.output))


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel hashing workers (default: all cores).")
@click.option("--fast", is_flag=True,
              help="Trust digests modelpatch cached after a full verification of the same "
                   "unchanged files (device, inode, size, mtime).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@quiet_option
@click.pass_context
def verify(ctx, directory, jobs, fast, as_json):
    """Rehash DIRECTORY against its provenance manifest. Exit 1 on any mismatch."""
    from . import api
    from .render import render_verify

    bar = _bar(ctx, "verifying")
    try:
        report = api.verify(directory, jobs=jobs, fast=fast,
                            on_progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    data = report.as_dict()
    click.echo(json.dumps(data, indent=2) if as_json else render_verify(data))
    if not report.ok:
        ctx.exit(1)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option("-o", "--output", "out", type=click.Path(path_type=str), default=None,
              help="Rebuild the base into OUT instead of reverting DIRECTORY in place.")
@click.option("--all", "all_patches", is_flag=True, help="Revert every patch, back to the original.")
@click.option("--force", is_flag=True, help="Revert even if DIRECTORY changed since the patch.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def revert(directory, out, all_patches, force, jobs, as_json):
    """Undo the last patch of DIRECTORY (byte-identical, symlinks restored)."""
    from . import api

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
@click.option("--private/--public", default=True, show_default=True)
@click.option("--revision", default=None, help="Branch to commit to (created if needed).")
@click.option("-m", "--message", default=None, help="Commit message.")
@click.option("--json", "as_json", is_flag=True)
@quiet_option
@click.pass_context
def publish(ctx, directory, repo_id, endpoint, private, revision, message, as_json):
    """Verify the variant DIRECTORY and upload it to REPO_ID in one commit."""
    from . import api

    r = api.publish(directory, repo_id, endpoint=endpoint, private=private, revision=revision,
                    message=message, progress=not ctx.obj.get("quiet"))
    if as_json:
        _emit_json({"repo_id": r.repo_id, "revision": r.revision, "commit": r.commit,
                    "files": r.files})
    else:
        click.echo(f"{r.repo_id}@{r.revision} {r.commit}")


@main.command()
@click.argument("repo_id")
@click.option("-o", "--output", "out", type=click.Path(path_type=str), default=None,
              help="Directory to create (default: ./<name>).")
@click.option("--endpoint", default=None, envvar="HF_ENDPOINT")
@click.option("--revision", default=None, help="Branch, tag or commit.")
@quiet_option
@click.pass_context
def pull(ctx, repo_id, out, endpoint, revision):
    """Download REPO_ID and verify every file against the hub's digests and the manifest."""
    from . import api

    result = api.pull(repo_id, out, endpoint=endpoint, revision=revision,
                      progress=not ctx.obj.get("quiet"))
    click.echo(str(result.output))


@main.group()
def hub() -> None:
    """A self-hosted hub speaking the Hugging Face Hub API (needs modelpatch[hub])."""


@hub.command("serve")
@click.option("--root", required=True, type=click.Path(file_okay=False, path_type=str),
              help="Storage directory (blobs, repositories, tokens.json).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
def hub_serve(root, host, port):
    """Serve repositories stored under ROOT until interrupted."""
    try:
        from .hub.server import serve
    except ImportError as exc:
        raise click.ClickException(f"the hub server needs its extra: pip install "
                                   f"'modelpatch[hub]' ({exc.name} is missing)") from None
    from pathlib import Path

    serve(Path(root), host=host, port=port)


@main.group()
def recipes() -> None:
    """List and show the built-in recipes."""


@recipes.command("list")
def recipes_list() -> None:
    """List the built-in recipes with their descriptions."""
    from .recipe import builtin_recipe_dir, load_recipe

    for path in sorted(builtin_recipe_dir().glob("*.yaml")):
        recipe = load_recipe(path)
        summary = " ".join(recipe.description.split())
        click.echo(f"{recipe.name:<22} {summary[:100]}")


@recipes.command("show")
@click.argument("name")
def recipes_show(name: str) -> None:
    """Print the built-in recipe NAME (or a recipe file)."""
    from .recipe import resolve_recipe

    click.echo(resolve_recipe(name).read_text(encoding="utf-8"), nl=False)


if __name__ == "__main__":
    main()
