"""In-memory tests of the AMQP session (no sockets): see memory.py."""
