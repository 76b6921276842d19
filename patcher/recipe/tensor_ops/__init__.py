"""A recipe's ``tensors:`` section: its typed form (``schema``), its validation (``parse``, and
``split_scale`` for the split/scale/refuse actions) and the dtype vocabulary (``dtype_names``).

Part of ``patcher.recipe``; the same import rules (never ``execute`` or ``hub``)."""
