"""hutch-perf: a load generator for any AMQP 0-9-1 broker, in the spirit of RabbitMQ PerfTest.

Owns: the benchmark client and its process layout. Modules, from pure to effectful:

- `options`   - command-line options and AMQP URI parsing (pure; `UsageError` for bad input).
- `histogram` - the log-bucket latency histogram (pure, mergeable, bounded memory).
- `report`    - per-second lines, the summary and the JSON line (pure formatting).
- `protocol`  - a raw AMQP client on `asyncio.Protocol`, built on the sans-I/O codec in `hutch.amqp`.
- `producer`, `consumer` - the hot paths: pre-encoded publishes, in-place delivery parsing.
- `worker`    - the entry point of a producer or consumer OS process.
- `runner`    - the parent process: declares the topology, starts the workers, prints the figures.

Rule: this package is a client, not part of the broker; it may import asyncio, sockets and clocks
(the exception to "only `runtime` does IO" that every CLI tool needs), but the broker never imports it.
"""
