"""The plan: everything an apply will do, computed as pure data before any write.

``types`` (``Action``, ``FilePlan``, ``Plan``, ``PlanOptions``, the ``FileTask`` contract),
``changes`` (the change log's records, each a ``Change``), ``build`` (``plan(recipe, model)``,
``check_unchanged``, ``require_change``), and the planning of each kind of operation: tensors
(``tensors`` over the virtual view of ``tensor_view``; ``resharding``, ``scales``,
``fused_groups``, ``quant_consistency``) and GGUF files (``gguf``, ``gguf_metadata``,
``gguf_reshard``).

May import ``recipe``, ``model``, ``config``, ``tensors`` (tasks and schemes) and ``gguf``
(headers and tasks); the executors, saved plans, the hub and the API import it, never the
layers below.
"""

from .build import check_unchanged, plan, require_change
from .types import Action, FilePlan, Plan, PlanOptions

__all__ = ["Action", "FilePlan", "Plan", "PlanOptions", "check_unchanged", "plan",
           "require_change"]
