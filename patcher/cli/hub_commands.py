"""The hub commands: ``publish`` (verify a variant, then upload it in one commit), ``pull``
(download and verify) and ``hub serve`` (the embedded hub). Registered on the main group by
``commands``."""

from __future__ import annotations

import click

from .group import base_model_option, emit_json, quiet_option
from .options import endpoint_option, force_option, json_option, output_option
from .output import echo


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.argument("repo_id")
@endpoint_option("Hub URL (default: huggingface.co, or $HF_ENDPOINT).")
@click.option("--private/--public", default=True, show_default=True,
              help="Visibility of the repository if publish creates it.")
@click.option("--revision", default=None, help="Branch to commit to (created if needed).")
@click.option("-m", "--message", default=None, help="Commit message.")
@json_option("Machine-readable result (repo_id, revision, commit, files, copied_bytes, "
             "uploaded_bytes, transport: xet or lfs, xet_new_bytes: what Xet sent of them).")
@click.option("--plan", "plan_only", is_flag=True,
              help="Only show what would be copied server-side from the base repository and "
                   "what uploaded; change nothing.")
@base_model_option
@click.option("--base", "is_base", is_flag=True,
              help="DIRECTORY is a plain model, not a variant: upload its files with a record "
                   "of their sha256, which pull checks as it checks a variant's manifest.")
@quiet_option
@click.pass_context
def publish(ctx, directory, repo_id, endpoint, private, revision, message, as_json, plan_only,
            base_model, is_base):
    """Verify the variant DIRECTORY and upload it to REPO_ID in one commit. Files its base
    repository on the hub already holds are copied there server-side, not uploaded. With
    --base: upload the model DIRECTORY as it is, for variants to be made from."""
    from .. import api
    from . import render

    progress = not ctx.obj.get("quiet")
    if is_base:
        if base_model:
            raise click.UsageError("--base-model names the base of a variant; --base publishes "
                                   "the base itself")
        r = api.publish(directory, repo_id, base=True, endpoint=endpoint, private=private,
                        revision=revision, message=message, progress=progress,
                        plan_only=plan_only)
    else:
        r = api.publish(directory, repo_id, endpoint=endpoint, private=private,
                        revision=revision, message=message, progress=progress,
                        base_model=base_model, plan_only=plan_only)
    if as_json:
        emit_json({"repo_id": r.repo_id, "revision": r.revision, "commit": r.commit,
                    "files": r.files, "copied_bytes": r.plan.copy_bytes,
                    "uploaded_bytes": r.plan.upload_bytes, "transport": r.plan.transport,
                    "xet_new_bytes": r.plan.xet.new_bytes if r.plan.xet else 0})
    elif plan_only:
        echo(f"plan: {r.plan.summary()}")
        for name, (src, size) in sorted(r.plan.copies.items()):
            echo(f"  copy    {name} ({render.human_bytes(size)}) <- {src}")
        for name, size in sorted(r.plan.uploads.items()):
            echo(f"  upload  {name} ({render.human_bytes(size)})")
    else:
        echo(f"{r.repo_id}@{r.revision} {r.commit}")


@click.command()
@click.argument("repo_id")
@output_option("Directory to create (default: ./<name>).")
@endpoint_option("Hub URL (default: huggingface.co, or $HF_ENDPOINT).")
@click.option("--revision", default=None, help="Branch, tag or commit.")
@click.option("--reuse", "reuse", multiple=True, type=click.Path(file_okay=False, path_type=str),
              help="Directory whose files to link instead of downloading when their sha256 "
                   "matches (repeatable; the Hugging Face cache is always searched).")
@force_option("Replace an existing output that an earlier pull or apply wrote, in one rename "
              "(as apply --force); only the files that changed are downloaded.")
@click.option("--key", "pub_key", type=click.Path(dir_okay=False, path_type=str), default=None,
              metavar="PUB.pem", help="Also require model.sig signed by this public key, and "
                                      "every file as it signed them.")
@json_option("Machine-readable result (output, repo_id, commit, files, reused_bytes, "
             "downloaded_bytes, rebuilt_bytes: files rebuilt through Xet from local chunks, "
             "received_bytes: what the hub sent for them).")
@quiet_option
@click.pass_context
def pull(ctx, repo_id, out, endpoint, revision, reuse, force, pub_key, as_json):
    """Download REPO_ID and verify every file against the hub's digests and the manifest."""
    from .. import api
    from .progress import Meters

    trust = api.trust_of(pub_key)          # a bad key file fails before the download
    quiet = bool(ctx.obj.get("quiet"))
    with Meters(quiet) as meters:
        meter = meters.meter("downloading")
        result = api.pull(repo_id, out, endpoint=endpoint, revision=revision,
                          progress=not quiet, reuse=reuse, force=force, trust=trust,
                          on_progress=meter.update, on_total=meter.set_total)
    if as_json:
        emit_json({"output": str(result.output), "repo_id": repo_id, "commit": result.commit,
                   "files": result.files, "reused_bytes": result.reused_bytes,
                   "downloaded_bytes": result.downloaded_bytes,
                   "rebuilt_bytes": result.rebuilt_bytes,
                   "received_bytes": result.received_bytes})
    else:
        echo(str(result.output))


@click.group()
def hub() -> None:
    """A self-hosted hub speaking the Hugging Face Hub API (needs the hub extra)."""


@hub.command("serve")
@click.option("--root", required=True, type=click.Path(file_okay=False, path_type=str),
              help="Storage directory (blobs, repositories, tokens.json).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port to listen on (0: any free port).")
@click.option("--init", is_flag=True,
              help="Create ROOT if it does not exist: a new, empty hub (without it a missing "
                   "ROOT is refused, so a mistyped path never serves an empty hub).")
@click.option("--public-url", default=None, metavar="URL",
              help="The URL clients reach this hub at (behind a proxy that rewrites the Host): "
                   "the Xet CAS URL and the upload links it hands out start with it. Default: "
                   "the URL each request came to.")
def hub_serve(root, host, port, init, public_url):
    """Serve repositories stored under ROOT until interrupted."""
    import os
    from pathlib import Path

    from ..errors import InputError

    if not os.path.lexists(root):
        if not init:
            raise InputError("no hub here: the directory does not exist", where=root,
                             hint="check --root, or add --init to create a new, empty hub")
        Path(root).mkdir(parents=True)
    try:
        from ..hub.server.app import serve
    except ImportError as exc:
        raise click.ClickException(f"the hub server needs its extra: pip install -e '.[hub]' "
                                   f"in the modelpatch checkout ({exc.name} is missing)") from None

    from .. import collector

    collector.ONE_COMMAND = False       # a long-running process: never freeze the collector
    if public_url is not None and not public_url.startswith(("http://", "https://")):
        raise click.BadParameter("must start with http:// or https://",
                                 param_hint="--public-url")
    serve(Path(root), host=host, port=port, public_url=public_url)


@hub.command("gc")
@click.option("--root", required=True, type=click.Path(file_okay=False, exists=True,
                                                       path_type=str),
              help="Storage directory of the hub (as for hub serve).")
@click.option("--grace", default=3600, show_default=True, type=click.IntRange(0, None),
              metavar="SECONDS",
              help="Keep what is younger than this: an upload in progress whose files are not "
                   "registered yet.")
@json_option()
def hub_gc(root, grace, as_json):
    """Remove the Xet storage (xorbs) no repository of the hub references.

    Safe while the hub serves: files being registered hold the collector off, and anything
    younger than --grace stays. A xorb any repository still uses is never removed."""
    from pathlib import Path

    from ..errors import InputError
    from ..hub.store.storage import Store
    from ..hub.store.xet_gc import collect_garbage

    if not (Path(root) / "repos").is_dir():     # never lay a new hub out in a mistyped directory
        raise InputError("not a hub: it has no repos/ directory", where=root,
                         hint="--root takes the directory hub serve runs on")
    report = collect_garbage(Store(Path(root)), grace_s=grace)
    if as_json:
        emit_json({"xorbs_removed": report.xorbs_removed, "bytes_freed": report.bytes_freed,
                   "xorbs_kept": report.xorbs_kept, "files_removed": report.files_removed})
    else:
        echo(f"removed {report.xorbs_removed} xorbs ({report.bytes_freed} bytes), "
             f"kept {report.xorbs_kept}")


def apply_and_publish(recipe, model, repo_id, endpoint, as_json, allow_noop, base_model,
                      params, conflicting) -> None:
    """``apply RECIPE hf://... --publish REPO_ID``: a config-only variant made on the hub."""
    from ..model_ref import is_hub
    from ..remote.apply import apply_and_publish as run

    if not is_hub(model):
        raise click.UsageError("--publish needs MODEL as hf://ORG/NAME[@REV]; for a local "
                               "variant run `modelpatch publish`")
    if conflicting:
        raise click.UsageError("--publish excludes --in-place, -o/--output, --dry-run and "
                               "--max-shard-size")
    r = run(recipe, model, repo_id, endpoint=endpoint, base_model=base_model,
            allow_noop=allow_noop, params=params)
    if as_json:
        emit_json({"repo_id": r.repo_id, "revision": r.revision, "commit": r.commit,
                    "fetched": r.fetched, "copied_bytes": r.plan.copy_bytes,
                    "uploaded_bytes": r.plan.upload_bytes})
    else:
        echo(f"fetched: {', '.join(r.fetched) or 'nothing'}")
        echo(f"{r.repo_id}@{r.revision} {r.commit}")
