"""sha256 digests of files: parallel hashing (``hashing``), hashing while writing and copying
(``hash_writer``), the digest cache (``digest_cache``) and the digest of a base shard computed
from a rewrite's own reads (``source_digest``).

Part of ``patcher.integrity``; the same import rules."""
