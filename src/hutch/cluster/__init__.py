"""Clustering, the pure parts: inter-node wire formats, replicated metadata, membership.

Nothing here does IO; the asyncio side (the transport between nodes, the Raft driver, the cluster
service of a node) lives in `hutch.runtime` (see docs/clustering.md).
"""
