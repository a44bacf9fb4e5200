"""Micro-benchmarks of the codec's per-message work: content-properties decode, frame splitting, and each
hot-path function of the pure reference (`frames`) beside the compiled one (`_cframes`, when built).

Usage: python benchmarks/codec_micro.py
"""

from __future__ import annotations

import time

from hutch.amqp import frames, spec

try:
    from hutch.amqp import _cframes
except ImportError:  # not built: only the pure path is measured
    _cframes = None  # type: ignore[assignment]


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
    hot_path(publish)


def hot_path(publish: bytes) -> None:
    """ns per call of each hot-path function, pure and compiled, on a 16-byte message's frames."""
    chunk = publish * 1000
    publish_payload = frames.method_frame_raw(1, spec.Basic.Publish(routing_key="bench").encode())[7:-1]
    header = frames.content_frames(1, 60, spec.BasicProperties(delivery_mode=1).encode(), b"x" * 16, 0)
    header_payload = b"".join(header[:2])[7:]
    ack = spec.Basic.Ack(delivery_tag=12345, multiple=True).encode()
    prefix = b"\x00\x3c\x00\x3c\x0bamq.ctag-ab"
    impls = [("pure", frames)] + ([("compiled", _cframes)] if _cframes is not None else [])
    for name, impl in impls:
        reader = impl.FrameReader(131072)

        def split(reader=reader) -> None:
            reader.feed(chunk)
            for _ in reader.frames():
                pass

        out: list[bytes] = []
        cases = {
            "FrameReader.frames (per frame)": (split, 200, 3000),
            "parse_publish": (lambda impl=impl: impl.parse_publish(publish_payload), 200_000, 1),
            "parse_content_header": (lambda impl=impl: impl.parse_content_header(header_payload), 200_000, 1),
            "parse_ack": (lambda impl=impl: impl.parse_ack(ack), 200_000, 1),
            "append_delivery, 16 B": (lambda impl=impl, out=out: (impl.append_delivery(
                out, 1, prefix, 99, False, b"\x00\x05bench", header_payload, b"x" * 16, 131072), out.clear()),
                200_000, 1),
        }
        for label, (fn, n, per) in cases.items():
            print(f"{name:8} {label}: {per_call_us(fn, n) / per * 1000:.0f} ns")


if __name__ == "__main__":
    main()
