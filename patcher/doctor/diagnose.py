"""``doctor``: the rules that hold for a model on a target engine and GPU, as findings.

Each finding carries its severity, one line, the evidence (the engine's source or a public
issue/PR, with the versions it applies to) and the recipe that fixes it. Rules that needed a fact
the user did not give (``--engine``, ``--gpu``) are listed as not checked, never as passed.
"""

from __future__ import annotations

import shlex
from typing import Any

from ..config.json_pointer import MISSING, resolve
from ..display import printable_fields
from ..model.model_dir import ModelDir
from ..units import plural
from .report import DoctorReport, Finding, Fix, NotChecked
from .rules import SEVERITIES, Rule, evaluate
from .target import Target

MODEL_FACTS = "@model"
#: The built-in rules that read a GGUF's metadata (``@model`` ``/gguf``).
GGUF_RULES = ("gguf-mtp-layers-unused", "gguf-eos-inconsistent")


class _LazyFacts(dict):
    """A JSON object whose members are computed when a rule first reads them (the guard
    evaluator reads objects with ``get``): importing transformers costs seconds."""

    def __init__(self, makers: dict):
        super().__init__()
        self._makers = makers

    def get(self, key, default=None):
        if key in self._makers and not super().__contains__(key):
            self[key] = self._makers[key]()
        return super().get(key, default)


def model_facts(model: ModelDir) -> dict:
    """What rules read as the file ``@model``: facts derived from the whole model.

    ``quantization``: inspect's summary (``disagreements`` between config.json and
    hf_quant_config.json among it); ``native_model_type``: whether the installed transformers
    has a native class for config.json's model_type (None without transformers);
    ``tensor_count``: tensors the model loads; ``tensor_groups``: their count per module group
    of ``inspect`` (only groups that have tensors: ``/tensor_groups/lm_head`` exists or not);
    ``unloaded_shards``: safetensors files the model does not load (not in its index);
    ``safetensors``: every safetensors file;
    ``tensors``: tensor name -> shard (``/tensors/lm_head.weight`` exists or not); ``eos``,
    ``quant_ignore``, ``kv_scale_names``, ``layers_past_config``, ``gguf``: see
    ``patcher.doctor.facts``; ``mla``: whether vLLM runs the attention as MLA, as recipe
    conditions read it too (``patcher.model.mla``)."""
    from ..model.inspect_model import quantization_summary
    from ..model.mla import uses_mla
    from . import facts

    return _LazyFacts({
        "quantization": lambda: quantization_summary(model),
        "native_model_type": lambda: _transformers_knows(model.config.get("model_type")),
        "native_class": lambda: _native_class(model.config),
        "tensor_count": lambda: len(model.tensor_shards),
        "tensor_groups": lambda: _tensor_groups(model),
        "unloaded_shards": lambda: sorted(set(model.shards) - set(model.model_shards)),
        "safetensors": lambda: sorted(model.shards),
        "tensors": lambda: model.tensor_shards,
        "eos": lambda: facts.eos_facts(model),
        "quant_ignore": lambda: facts.ignore_facts(model),
        "kv_scale_names": lambda: facts.kv_scale_names(model),
        "layers_past_config": lambda: facts.layers_past_config(model),
        "mla": lambda: uses_mla(model.config),
        "gguf": lambda: facts.gguf_facts(model)})


def _tensor_groups(model: ModelDir) -> dict[str, int]:
    from collections import Counter

    from ..model.inspect_model import module_group

    return dict(Counter(module_group(name) for name in model.tensor_shards))


def _transformers_knows(model_type: Any) -> bool | None:
    """Whether the installed transformers has a native class for ``model_type`` (None: no
    transformers here, or no model_type)."""
    if not isinstance(model_type, str):
        return None
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return None
    return model_type in CONFIG_MAPPING_NAMES


def _native_class(config: dict) -> dict | None:
    """no-remote-code's params: config.json's own model_type and architectures, when the
    installed transformers has a native class for each (else None)."""
    archs, model_type = config.get("architectures"), config.get("model_type")
    if not (_transformers_knows(model_type) and isinstance(archs, list) and archs
            and all(isinstance(a, str) for a in archs)):
        return None
    from transformers.models.auto import modeling_auto

    native = {name for key, table in vars(modeling_auto).items()
              if key.endswith("_MAPPING_NAMES") and isinstance(table, dict)
              for name in table.values() if isinstance(name, str)}
    return {"model_type": model_type, "architectures": archs} if set(archs) <= native else None


def diagnose(model: ModelDir, target: Target, rules: list[Rule]) -> DoctorReport:
    """The doctor report: findings (blockers first), rules not checked, the target."""
    facts = None

    def read(file: str) -> Any:
        nonlocal facts
        if file == MODEL_FACTS:
            facts = facts if facts is not None else model_facts(model)
            return facts
        return model.json(file)

    findings, not_checked = [], []
    for rule in rules:
        missing: set[str] = set()
        if evaluate(rule.when, read, target, missing):
            findings.append(_finding(rule, read))
        elif missing:
            not_checked.append(NotChecked(rule.id, tuple(sorted(missing))))
    findings.sort(key=lambda f: SEVERITIES.index(f.severity))
    note = None
    if not model.has("config.json") and any(rel.endswith(".gguf") for rel in model.files):
        note = (f"a GGUF model: only the rules that read GGUF metadata "
                f"({', '.join(GGUF_RULES)}) checked it; the others read config.json "
                f"and safetensors headers")
    return DoctorReport(str(model.root), target, tuple(findings), tuple(not_checked), note)


def _finding(rule: Rule, read) -> Finding:
    details = None
    if rule.details is not None:
        value = resolve(read(MODEL_FACTS), rule.details)
        details = None if value is MISSING else value
    fix = _fix(rule.fix, read)
    return Finding(rule.id, rule.severity, rule.summary, details, rule.details,
                   tuple(rule.evidence), None if fix is None else Fix.of(fix), rule.source)


def _fix(fix: dict | None, read) -> dict | None:
    """The rule's fix, its ``params_from`` (a pointer into ``@model``) resolved into params;
    None when that pointer finds no params (the model does not say enough to fix it)."""
    if fix is None or "params_from" not in fix:
        return fix
    params = resolve(read(MODEL_FACTS), fix["params_from"])
    if not isinstance(params, dict):
        return None
    return {"recipe": fix["recipe"], "params": {**(fix.get("params") or {}), **params}}


def render(typed: DoctorReport) -> str:
    """The text of a report (its findings; ``--fix``'s outcome is the command's to say)."""
    report = printable_fields(typed.to_json())
    t = report["target"]
    engine = f"{t['engine']}=={t['engine_version']}" if t["engine"] else "no engine given"
    model_words = [report["model"]]
    if report.get("remote"):            # the commit read, on the hub read: runs as printed
        from ..remote.model import command_words

        model_words = command_words(report["remote"])
    lines = [f"model      {report['model']}",
             f"target     {engine}, {t['gpu'] or 'no GPU given'}"]
    for f in report["findings"]:
        lines.append(f"{f['severity'].upper():<10} {f['rule']}: {f['summary']}")
        lines += _details_lines(f)
        for e in f["evidence"]:
            lines.append(f"{'':<11}evidence: {e['source']} ({e['versions']})")
        if f["fix"]:
            also = "" if f["severity"] == "info" else "  (or doctor --fix)"
            lines.append(f"{'':<11}fix: {fix_command(f['fix'], model_words)}{also}")
    for n in report["not_checked"]:
        needs = ["--engine NAME==VERSION" if "engine_version" in n["needs"] else "--engine"
                 ] if {"engine", "engine_version"} & set(n["needs"]) else []
        needs += ["--gpu"] if "gpu" in n["needs"] else []
        lines.append(f"{'not run':<10} {n['rule']}: needs {' and '.join(needs)}")
    if report.get("note"):
        lines.append(f"{'note':<10} {report['note']}")
    blockers = report["blockers"]
    lines.append(f"{plural(len(report['findings']), 'finding')}, {plural(blockers, 'blocker')}"
                 if report["findings"] else "no findings")
    return "\n".join(lines)


def _details_lines(finding: dict) -> list[str]:
    """The finding's details, labelled with the last name of the rule's ``details`` pointer:
    sentences one per line, short values (layer numbers, names) on one line."""
    details = finding["details"]
    if not details:
        return []
    shown = details if isinstance(details, list) else [details]
    if all(isinstance(d, str) and " " in d for d in shown):
        return [f"{'':<11}- {d}" for d in shown]
    label = (finding.get("details_from") or "/details").rsplit("/", 1)[-1].replace("_", " ")
    return [f"{'':<11}{label}: {', '.join(map(str, shown))}"]


def fix_command(fix: dict, model: str | list[str]) -> str:
    """The ``modelpatch apply`` command line of a finding's fix, every word quoted for a POSIX
    shell (``eos_token=<|eot|>`` would be a redirection, ``[EOS]`` a glob). ``model``: its
    path, or the words naming it (``hf://ORG/NAME@COMMIT --endpoint URL``)."""
    params = fix.get("params") or {}
    words = ["modelpatch", "apply", fix["recipe"]]
    for key, value in params.items():
        words += ["--set", f"{key}={_param_text(value)}"]
    model_words = [model] if isinstance(model, str) else model
    return " ".join(shlex.quote(w) for w in [*words, *model_words])


def _param_text(value) -> str:
    """A param as ``--set`` takes it: a list comma-separated."""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)
