"""Models on a hub, read without downloading their tensor data (``hf://org/name[@rev]``)."""
