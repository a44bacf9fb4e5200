"""Federation: exchanges and queues linked to upstream brokers by shovel-like links (docs/federation.md)."""
