"""Recipe parameters: ``params:`` declarations and ``include:`` items parsed (``parse``), the
``{reference}`` template language (``expr``), and binding a recipe to a model and parameter
values (``bind``).

Part of ``patcher.recipe``; the same import rules (never ``execute`` or ``hub``)."""
