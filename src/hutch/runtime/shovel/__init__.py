"""Dynamic shovels: an AMQP 0-9-1 client inside the node moving messages between two brokers (docs/shovel.md)."""
