"""Reply texts always fit an AMQP short string."""

from hutch.amqp.errors import PRECONDITION_FAILED, ChannelError


def test_long_reply_texts_are_cut_to_255_bytes() -> None:
    err = ChannelError(PRECONDITION_FAILED, "inequivalent arg 'durable' for queue '" + "é" * 300 + "'")
    text = err.reply_text
    assert len(text.encode()) <= 255 and text.endswith("...")
    assert text.startswith("PRECONDITION_FAILED - inequivalent arg")
    short = ChannelError(PRECONDITION_FAILED, "short")
    assert short.reply_text == "PRECONDITION_FAILED - short"
