"""The controller's one queue: SQS messages in, with who sent them; deleted once handled.

Reads are bounded: at most 10 messages a call (SQS's own cap), each at most 256 KiB (SQS's), and the report
parser refuses more than 16 KiB. ``SenderId`` comes with every message (:mod:`.verify` checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .fleet import FleetError, boto_client, error_text


@dataclass(frozen=True)
class Message:
    id: str
    receipt: str
    body: str
    sender_id: str


class Inbox(Protocol):
    def receive(self, wait: float) -> list[Message]:
        """Up to 10 messages, waiting at most ``wait`` seconds for the first; raises FleetError."""
        ...

    def delete(self, messages: Sequence[Message]) -> None:
        """Delete handled messages; raises FleetError."""
        ...


class SqsInbox:
    def __init__(self, queue_url: str, sqs: Any = None) -> None:
        self.queue_url = queue_url
        self.sqs = sqs if sqs is not None else boto_client("sqs", timeout=30.0)

    def receive(self, wait: float) -> list[Message]:
        try:
            got = self.sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=max(0, min(20, int(wait))),
                MessageSystemAttributeNames=["SenderId", "SentTimestamp"],
            )
        except Exception as exc:
            raise FleetError("sqs:ReceiveMessage", error_text(exc)) from None
        return [
            Message(
                str(m.get("MessageId", "")),
                str(m.get("ReceiptHandle", "")),
                str(m.get("Body", "")),
                str(m.get("Attributes", {}).get("SenderId", "")),
            )
            for m in got.get("Messages", [])
        ]

    def delete(self, messages: Sequence[Message]) -> None:
        for start in range(0, len(messages), 10):
            batch = messages[start : start + 10]
            entries = [{"Id": str(i), "ReceiptHandle": m.receipt} for i, m in enumerate(batch)]
            try:
                got = self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            except Exception as exc:
                raise FleetError("sqs:DeleteMessageBatch", error_text(exc)) from None
            if got.get("Failed"):
                why = "; ".join(str(f.get("Message", f.get("Code", ""))) for f in got["Failed"])
                raise FleetError("sqs:DeleteMessageBatch", why)
