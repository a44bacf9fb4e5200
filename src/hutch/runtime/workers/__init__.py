"""Worker processes: one node served by several processes, one per core (docs/scaling.md).

`supervisor` is the parent (`hutch-server --workers N`): it reserves the listening ports, makes the
socket pairs of the worker link, starts, watches and replaces the workers, and does no message work.
`spec` is what a worker is told when it starts, `link` the worker's end of its control socket to the
supervisor, `cores` how many cores `--workers auto` means.
"""
