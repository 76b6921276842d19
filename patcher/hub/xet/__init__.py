"""The Xet storage format (hub-docs ``docs/xet/``): content-defined chunking, the hashes, xorbs and
shards. Pure functions over bytes: no HTTP, no files (the hub's server and store use them)."""
