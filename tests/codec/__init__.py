"""Codec tests: the sans-I/O AMQP 0-9-1 layer (`hutch.amqp`), with pamqp as an oracle."""
