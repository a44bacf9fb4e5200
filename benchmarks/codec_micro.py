"""Micro-benchmarks of the codec's per-message work: content-properties decode and frame splitting.

Usage: python benchmarks/codec_micro.py
"""

from __future__ import annotations

import time

from hutch.amqp import frames, spec


def per_call_us(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    plain = spec.BasicProperties(content_type="application/json", content_encoding="utf-8", delivery_mode=2,
                                 priority=0, correlation_id="abc", reply_to="reply", message_id="m-123")
    with_headers = spec.BasicProperties(content_type="application/json", delivery_mode=2,
                                        headers={"id": "abc", "task": "tasks.add", "retries": 0, "eta": None})
    for label, props in (("7 properties", plain), ("with a 4-entry headers table", with_headers)):
        raw = props.encode()
        us = per_call_us(lambda raw=raw: spec.BasicProperties.decode(raw, 0), 100_000)
        print(f"BasicProperties.decode, {label}: {us:.2f} us")
    publish = frames.method_frame(1, spec.Basic.Publish(routing_key="bench")) + b"".join(
        frames.content_frames(1, 60, spec.BasicProperties(delivery_mode=1).encode(), b"x" * 16, 131072))
    chunk = publish * 1000
    reader = frames.FrameReader(131072)

    def split() -> None:
        reader.feed(chunk)
        for _ in reader.frames():
            pass

    print(f"FrameReader.frames: {per_call_us(split, 200) / 3000 * 1000:.0f} ns per frame")


if __name__ == "__main__":
    main()
