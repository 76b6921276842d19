"""GGUF as a model format: strict header reading, writing, every write read back, a ``.gguf``
file as MODEL. The recipe's ``gguf:`` section is parsed in ``patcher.recipe.gguf_section`` and
planned in ``patcher.plan.gguf``.

gguf-py (the ``gguf`` package, ``pip install -e '.[gguf]'``, loaded by ``patcher.gguf_py``)
supplies the format's constants: value types, ggml tensor types and their block sizes, key
names. The header itself is parsed here (``patcher.gguf.format``), bounded and strict, for the
reasons given there.
"""
