"""A choice's tokens as the text a client is sent: decoded as they come, a piece held back while it ends inside a
character (a byte-level token may carry part of one) or may be the start of a stop sequence, and the text cut at
the first stop sequence, which is never sent, in part or whole (OpenAI's ``stop``)."""

from __future__ import annotations


class TextStream:
    """``push`` each token id, send what it returns; ``stopped`` once a stop sequence matched (the rest of the
    choice is not wanted); ``flush`` at the end for what was held back."""

    def __init__(self, tokenizer, stops: list[str]) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            return self._send(text[:cut])
        if text.endswith("\ufffd"):
            return ""
        return self._send(text[: len(text) - self._held(text)])

    def flush(self) -> str:
        """What is left at the end: a held possible stop start (no stop followed), a last cut character."""
        return "" if self.stopped else self._send(self.tokenizer.decode(self.ids))

    @property
    def text(self) -> str:
        return self.sent

    def _send(self, upto: str) -> str:
        # A decoder that rewrote what was already sent (byte-level ones never do) holds until it extends it again.
        if not upto.startswith(self.sent) or len(upto) <= len(self.sent):
            return ""
        piece, self.sent = upto[len(self.sent) :], upto
        return piece

    def _first_stop(self, text: str) -> int | None:
        start = max(0, len(self.sent) - max((len(s) for s in self.stops), default=0))
        found = [i for s in self.stops if (i := text.find(s, start)) >= 0]
        return min(found) if found else None

    def _held(self, text: str) -> int:
        """The length of the longest end of ``text`` that is the beginning of a stop sequence."""
        return max(
            (k for s in self.stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])), default=0
        )
