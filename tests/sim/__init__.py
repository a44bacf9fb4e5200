"""Seeded, deterministic simulation of the Raft core (see docs/raft.md, "How it is proven")."""
