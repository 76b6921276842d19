"""A recipe's ``tensors:`` section: its typed form (``schema``), its validation (``parse``) and
the dtype vocabulary (``dtype_names``).

Part of ``patcher.recipe``; the same import rules (never ``execute`` or ``hub``)."""
