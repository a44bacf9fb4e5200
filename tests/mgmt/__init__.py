"""Management tests: the HTTP API (`hutch.mgmt`) and hutchctl against a real node."""
