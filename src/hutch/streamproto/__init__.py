"""RabbitMQ's stream protocol, sans-I/O (rabbitmq-server deps/rabbitmq_stream/docs/PROTOCOL.adoc).

Owns: the command keys, response codes and offset types (`codes`), the typed errors (`errors`), the
frame reader with its size limit (`framer`), every command a client sends or receives as a record with
one encoder and one decoder (`commands`), and the entries of a publish (`commands.PublishedEntry`).
Stdlib only: no asyncio, no sockets, no hutch imports outside this package (docs/streams.md).
"""
