"""Models on a hub, read without downloading their tensor data (``hf://org/name[@rev]``),
recipes' ``from:`` sources fetched (``sources``), and ``apply hf:// --publish`` (``apply``)."""
