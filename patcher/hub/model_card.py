"""The model card (README.md) of a published variant.

An existing card's text and metadata are kept. The metadata gains ``base_model``, the
``modelpatch`` tag and the recipe name; the body gains (or has replaced) one section between
markers that lists what the patch changed. Parsing and rendering go through huggingface_hub's
``ModelCard``, so the front matter stays what the Hub expects.
"""

from __future__ import annotations

import re

from ..manifest import Manifest

CARD_NAME = "README.md"
BEGIN, END = "<!-- modelpatch:begin -->", "<!-- modelpatch:end -->"
_SECTION = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.S)
_CACHE_REPO = re.compile(r"(?:^|/)(?:models|datasets|spaces)--([^/]+?)--([^/]+)/snapshots/")


def base_model_id(base: str) -> str:
    """``org/name`` for a base inside a Hugging Face cache, else the directory's name."""
    match = _CACHE_REPO.search(base)
    return f"{match.group(1)}/{match.group(2)}" if match else base.rstrip("/").rsplit("/", 1)[-1]


def change_lines(manifest: Manifest, limit: int = 40) -> list[str]:
    lines = []
    for c in manifest.changes:
        kind = c.get("kind")
        if kind in ("removed", "set", "renamed", "copied"):
            target = f"`{c['path']}`" + (f" from `{c['from']}`" if c.get("from") else "")
            lines.append(f"- `{c['file']}`: {kind} {target}")
        elif kind == "tensor_converted":
            b, a = c["before"], c["after"]
            lines.append(f"- tensor `{c['tensor']}`: {c['how']} {b['dtype']}{b['shape']} -> "
                         f"{a['dtype']}{a['shape']}")
        elif kind in ("tensor_dropped", "tensor_renamed"):
            extra = f" -> `{c['to']}`" if kind == "tensor_renamed" else ""
            lines.append(f"- tensor `{c['tensor']}`: {kind.split('_')[1]}{extra}")
        elif kind in ("file_dropped", "file_added"):
            lines.append(f"- file `{c['file']}`: {kind.split('_')[1]}")
    if len(lines) > limit:
        lines = lines[:limit] + [f"- ... and {len(lines) - limit} more (see "
                                 f"`modelpatch.provenance.json`)"]
    return lines


def render_card(existing: str | None, manifest: Manifest, base: str) -> str:
    from huggingface_hub import ModelCard

    card = ModelCard(existing or f"---\nbase_model: {base_model_id(base)}\n---\n")
    recipe = manifest.recipe
    data = card.data
    data.base_model = base_model_id(base)
    tags = list(data.tags or [])
    for tag in ("modelpatch", f"modelpatch-recipe:{recipe['name']}"):
        if tag not in tags:
            tags.append(tag)
    data.tags = tags
    data.modelpatch_recipe = recipe["name"]
    section = "\n".join([
        BEGIN,
        "## Patched with modelpatch",
        "",
        f"This is `{data.base_model}` with the modelpatch recipe `{recipe['name']}` "
        f"(sha256 `{recipe['sha256'][:16]}...`) applied. Every file is listed with its sha256 "
        f"in `modelpatch.provenance.json`; `modelpatch verify` checks a download against it.",
        "",
        *(change_lines(manifest) or ["- no changes"]),
        END,
        "",
    ])
    body = card.text
    body = _SECTION.sub(section, body) if _SECTION.search(body) else body.rstrip("\n") + (
        "\n\n" if body.strip() else "") + section
    card.text = body
    return str(card)
