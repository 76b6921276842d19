"""The model card (README.md) of a published variant.

An existing card's text and metadata are kept. The metadata gains ``base_model`` (when the
base's hub repository is known: ``patcher.model.base_identity``; otherwise any ``base_model``
there is
removed, as it would name another model), the ``modelpatch`` tag and the recipe name; the body
gains (or has replaced) one section between markers that lists what the patch changed. The YAML
front matter is read and written with ruamel.yaml (round-trip: the card's own keys keep their
order and comments), never assembled from strings, so no name (a directory called ``a: b`` or
holding a newline) can add metadata.

Every name in the body (a file, JSON pointer, tensor, GGUF key or value, recipe, source) is
written by ``code`` as an inline code span, its control characters escaped by
``patcher.display.printable``: no name can start a line of its own (a fake end marker, a
``---`` block, a heading) or leave the span (HTML such as ``<img onerror>``, a
``javascript:`` link), since Markdown shows a code span's text as it is. The markers are
found only as whole lines, so a marker inside a name is text.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

from ...display import printable
from ...errors import InputError
from ...integrity.change_log import TENSOR_GROUP
from ...integrity.manifest import CHANGES_BYPRODUCT, Manifest

CARD_NAME = "README.md"
# The hub's README.md is the model card publish writes, not the variant's file. The variant's own
# README.md (when it has one) travels under this name; pull puts it back and keeps the card
# under .modelpatch/hub/, where verify does not look.
ORIGINAL_README = "modelpatch-original-README.md"
HUB_FILES = ".modelpatch/hub"                  # what pull sets aside: the hub's, not the variant's
HUB_CARD_COPY = f"{HUB_FILES}/README.md"
BEGIN, END = "<!-- modelpatch:begin -->", "<!-- modelpatch:end -->"
_SECTION = re.compile(r"^" + re.escape(BEGIN) + r"[ \t]*\n.*?^" + re.escape(END) + r"[ \t]*(\n|\Z)",
                      re.S | re.M)
# Front matter as huggingface_hub's ModelCard finds it: a leading ``---`` line, then up to the
# next ``---`` line.
_FRONT_MATTER = re.compile(r"^(\s*---[\r\n]+)([\S\s]*?)([\r\n]+---(\r\n|\n|$))")


def recipe_chain(manifest: Manifest) -> list[tuple[dict, list[dict]]]:
    """(recipe, changes) of every patch behind ``manifest``, oldest first: stacked patches and
    variants of variants embed their base's statement, down to the original model."""
    chain, statement = [], manifest.statement
    while isinstance(statement, dict):
        build = statement.get("predicate", {}).get("buildDefinition", {})
        params = build.get("externalParameters", {})
        changes = next((item.get("annotations", {}).get("changes", [])
                        for item in statement["predicate"].get("runDetails", {})
                        .get("byproducts", []) if item.get("name") == CHANGES_BYPRODUCT), [])
        chain.append((params.get("recipe", {}), changes))
        statement = params.get("base_provenance")
    return chain[::-1]


def code(text: object) -> str:
    """``text`` as one inline code span of one line: controls (newlines too) escaped, and
    fenced with more backticks than any run it holds (CommonMark), padded when it starts or
    ends with one."""
    shown = printable(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", shown)), default=0) + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") or not shown.strip() else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def change_lines(changes: list[dict], limit: int = 40) -> list[str]:
    lines = []
    for c in changes:
        kind = c.get("kind")
        if kind in ("removed", "set", "renamed", "copied"):
            target = code(c["path"]) + (f" from {code(c['from'])}" if c.get("from") else "")
            lines.append(f"- {code(c['file'])}: {kind} {target}")
        elif kind == "tensor_converted":
            b, a = c["before"], c["after"]
            lines.append(f"- tensor {code(c['tensor'])}: {printable(c['how'])} "
                         f"{printable(b['dtype'])}{b['shape']} -> "
                         f"{printable(a['dtype'])}{a['shape']}")
        elif kind in ("tensor_dropped", "tensor_renamed"):
            extra = f" -> {code(c['to'])}" if kind == "tensor_renamed" else ""
            lines.append(f"- tensor {code(c['tensor'])}: {kind.split('_')[1]}{extra}")
        elif kind == TENSOR_GROUP:
            lines.append(_group_line(c))
        elif kind in ("file_dropped", "file_added"):
            lines.append(f"- file {code(c['file'])}: {kind.split('_')[1]}")
        elif kind == "gguf_metadata":
            lines.append(_gguf_metadata_line(c))
        elif kind == "content_source":
            resolved = str(c.get("resolved") or "")
            where = code(resolved) if resolved.startswith("hf://") else (
                "a local file" if resolved else f"{code(c['from'])} beside the recipe")
            lines.append(f"- {code(c['target'])}: content from {where} "
                         f"(sha256 {code(c['sha256'])})")
    if len(lines) > limit:
        lines = lines[:limit] + [f"- ... and {len(lines) - limit} more (see "
                                 f"`modelpatch.provenance.json`)"]
    return lines


def _group_line(c: dict) -> str:
    """One rule's tensor changes: ``- 7,688 tensors converted (dequantize:fp8-block,
    F8_E4M3 -> BF16), e.g. `a`, `b`, `c```."""
    count = c.get("count") if isinstance(c.get("count"), int) else 0
    what = printable(str(c.get("change", "")).removeprefix("tensor_"))
    dtypes = (f"{c['before_dtype']} -> {c['after_dtype']}"
              if c.get("before_dtype") and c.get("after_dtype") else None)
    detail = printable(", ".join(str(x) for x in (c.get("how"), dtypes) if x))
    examples = ", ".join(code(n) for n in c.get("examples", []))
    noun = "tensor" if count == 1 else "tensors"
    return (f"- {count:,} {noun} {what}" + (f" ({detail})" if detail else "")
            + (f", e.g. {examples}" if examples else ""))


def _gguf_metadata_line(c: dict) -> str:
    """A GGUF metadata change (``patcher.gguf.metadata``); long values cut to one short line."""
    if c["op"] == "rename":
        return f"- GGUF metadata {code(c['key'])}: renamed -> {code(c['to'])}"
    if c["op"] == "drop":
        return f"- GGUF metadata {code(c['key'])}: dropped"
    value = json.dumps(c.get("after"), ensure_ascii=False)
    value = value if len(value) <= 60 else value[:50] + "..."
    return f"- GGUF metadata {code(c['key'])}: set to {code(value)}"


def _yaml():
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt", pure=True)
    yaml.width = 4096                      # no folded lines in the card
    return yaml


def split_card(text: str) -> tuple[dict[str, Any], str]:
    """(metadata, body) of a model card; metadata is {} without front matter. Malformed front
    matter is an ``InputError`` naming README.md."""
    match = _FRONT_MATTER.search(text)
    if match is None:
        return {}, text
    from ruamel.yaml import YAMLError

    try:
        metadata = _yaml().load(match.group(2))
    except YAMLError as exc:
        problem = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise InputError(f"the model card's YAML front matter is invalid: {problem}",
                         where=CARD_NAME) from None
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise InputError("the model card's YAML front matter is not a mapping", where=CARD_NAME)
    return metadata, text[match.end():]


def dump_front_matter(metadata: dict[str, Any]) -> str:
    out = io.StringIO()
    _yaml().dump(metadata, out)
    return f"---\n{out.getvalue()}---\n"


def render_card(existing: str | None, manifest: Manifest, base_model: str | None,
                base: str, signer: str | None = None) -> str:
    """The card for a variant of ``base`` (its path: named in the text when ``base_model``, the
    hub repository ``ORG/NAME``, is None). ``signer``: who signed the variant's ``model.sig``;
    the base's signer comes from the manifest."""
    metadata, body = split_card(existing or "")
    chain = recipe_chain(manifest)
    if base_model:
        metadata["base_model"] = base_model
    else:
        metadata.pop("base_model", None)
    tags = metadata.get("tags")
    tags = list(tags) if isinstance(tags, list) else ([tags] if tags else [])
    for tag in ["modelpatch", *(f"modelpatch-recipe:{r['name']}" for r, _ in chain)]:
        if tag not in tags:
            tags.append(tag)
    metadata["tags"] = tags
    metadata["modelpatch_recipe"] = manifest.recipe["name"]
    if len(chain) > 1:
        metadata["modelpatch_recipes"] = [r["name"] for r, _ in chain]
    section = "\n".join([
        BEGIN,
        "## Patched with modelpatch",
        "",
        f"This is {_base_text(base_model, base)} with the modelpatch "
        f"{'recipe' if len(chain) == 1 else 'recipes'} "
        + ", then ".join(f"{code(r['name'])} (sha256 {code(str(r['sha256'])[:16] + '...')})"
                         for r, _ in chain)
        + " applied. Every file is listed with its sha256 in `modelpatch.provenance.json`; "
          "`modelpatch verify` checks a download against it.",
        "",
        *_signature_lines(manifest, signer),
        *_changes_section(chain),
        END,
        "",
    ])
    body = _SECTION.sub(lambda _: section, body) if _SECTION.search(body) else (
        body.rstrip("\n") + ("\n\n" if body.strip() else "") + section)
    return dump_front_matter(metadata) + body


def _signature_lines(manifest: Manifest, signer: str | None) -> list[str]:
    """Who signed the variant and its base (OMS ``model.sig``), as the signatures say."""
    lines = []
    if signer is not None:
        lines.append(f"Signed (OpenSSF Model Signing, `model.sig`) by {code(signer)}: "
                     f"`modelpatch verify DIR --key PUB.pem` or `model_signing verify` checks it.")
    external = manifest.predicate["buildDefinition"]["externalParameters"]
    base = external.get("base_signature")
    if isinstance(base, dict) and isinstance(base.get("signer"), str):
        checked = "verified when this variant was made" if base.get("verified") is True else \
            "not checked when this variant was made"
        lines.append(f"The base was signed by {code(base['signer'])} ({checked}; its "
                     f"`model.sig` is not carried into the variant, whose files differ).")
    return [*lines, ""] if lines else []


def _base_text(base_model: str | None, base: str) -> str:
    """The base as the card's body names it, on one line whatever the name holds."""
    if base_model:
        return code(base_model)
    name = " ".join(base.rstrip("/").rsplit("/", 1)[-1].split())
    return f"the model from {code(name)} (hub repository not recorded)"


def _changes_section(chain: list[tuple[dict, list[dict]]]) -> list[str]:
    if len(chain) == 1:
        return change_lines(chain[0][1]) or ["- no changes"]
    lines: list[str] = []
    for recipe, changes in chain:
        lines += [f"### {code(recipe['name'])}", "",
                  *(change_lines(changes) or ["- no changes"]), ""]
    return lines[:-1]
