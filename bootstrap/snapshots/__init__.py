"""Snapshots: the archive format, the directory store, the bucket store and its client."""
