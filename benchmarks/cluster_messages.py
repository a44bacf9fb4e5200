"""Micro-benchmark of the inter-node message codec on the per-message hot paths (docs/clustering.md).

Encodes and decodes a batch of 1000 remote publishes (and 1000 deliveries) the way the runtime does:
before = the dict form of the messages before the typed records (`{"t": "qp", ...}` packed with msgpack,
unpacked, and the Message rebuilt from its list); after = `hutch.cluster.messages` (a positional array
with a kind tag, decoded into the record, the Message rebuilt by the codec).

    PYTHONPATH=src python benchmarks/cluster_messages.py
"""

from __future__ import annotations

import statistics
import timeit

import msgpack

from hutch.cluster import messages as cm
from hutch.core.message import Message

N = 1000
_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def _unpack(b: bytes) -> object:
    return msgpack.unpackb(b, raw=False, strict_map_key=False, use_list=True)


def dict_message(m: Message) -> list[object]:
    return [m.exchange, m.routing_key, bytes(m.properties_raw), bytes(m.body), bytes(m.route_tail),
            m.foreign_deaths]


def dict_decode_message(v: list[object]) -> Message:
    msg = Message(v[0], v[1], None, v[3], v[2], v[4])  # type: ignore[arg-type]
    msg.foreign_deaths = bool(v[5])
    return msg


def before(msgs: list[Message]) -> None:
    packed = [_pack({"t": "qp", "v": "/", "q": "q1", "m": dict_message(m), "i": i}) for i, m in enumerate(msgs)]
    for b in packed:
        obj = _unpack(b)
        if obj.get("t") == "qp":  # type: ignore[union-attr]
            dict_decode_message(obj["m"])  # type: ignore[index]


def after(msgs: list[Message]) -> None:
    packed = [cm.encode(cm.RemotePublish("/", "q1", i, m)) for i, m in enumerate(msgs)]
    for b in packed:
        cm.decode(b)


def before_deliver(msgs: list[Message]) -> None:
    packed = [_pack({"t": "qd", "cid": 7, "d": i, "m": dict_message(m), "rd": False, "na": False})
              for i, m in enumerate(msgs)]
    for b in packed:
        obj = _unpack(b)
        dict_decode_message(obj["m"])  # type: ignore[index]


def after_deliver(msgs: list[Message]) -> None:
    packed = [cm.encode(cm.RemoteDeliver(7, i, m, False, False)) for i, m in enumerate(msgs)]
    for b in packed:
        cm.decode(b)


def main() -> None:
    body = b"x" * 16
    msgs = [Message("amq.direct", "rk", None, body, b"\x10\x00\x01", None) for _ in range(N)]
    # the two forms alternate, run by run, so that both see the same load on a shared machine
    for what, pair in (("publish", (before, after)), ("deliver", (before_deliver, after_deliver))):
        runs: dict[str, list[float]] = {"dict": [], "record": []}
        for _ in range(15):
            for form, fn in zip(("dict", "record"), pair, strict=True):
                runs[form].append(timeit.timeit(lambda fn=fn: fn(msgs), number=10) / 10 * 1e6 / N)
        for form, times in runs.items():
            print(f"{what} {form:6s} {min(times):.3f} us/msg best, {statistics.median(times):.3f} median (15 runs "
                  f"of 10 batches of {N})")


if __name__ == "__main__":
    main()
