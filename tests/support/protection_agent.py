"""A loopback stand-in for the ECS container agent's task scale-in protection endpoint.

Answers as the agent does (Amazon ECS Developer Guide, "Task scale-in protection endpoint"; the agent's
handlers in aws/amazon-ecs-agent, agent/handlers/agentapi/taskprotection/v1/handlers):

- ``PUT {ECS_AGENT_URI}/task-protection/v1/state`` with ``{"ProtectionEnabled": bool, "ExpiresInMinutes": n}``
  (n from 1 to 2880, default 120; an unknown field or a missing ProtectionEnabled is refused with HTTP 400
  and an ``error`` object, as the agent's strict decoder does); ``GET`` the same path for the state;
- success: HTTP 200 ``{"protection": {"ExpirationDate": RFC 3339 or null, "ProtectionEnabled": bool,
  "TaskArn": ...}}``; ECS refusing the task: HTTP 200 ``{"failure": {"Arn", "Reason", "Detail"}}``; an error
  (ECS's, e.g. AccessDeniedException without ``ecs:UpdateTaskProtection``, with its HTTP status; the agent's own
  timeout of its ECS call, 504): ``{"error": {"Arn", "Code", "Message"}}``;
- protection lapses at its expiration (the fake's ``wall`` clock).

``mode`` makes it misbehave: ``deny`` (400 AccessDeniedException), ``failure`` (TASK_NOT_VALID), ``hang``
(answers after ``hang_s``), ``garbage`` (not JSON).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TASK_ARN = "arn:aws:ecs:us-east-1:111122223333:task/triton/0123456789abcdef0123456789abcdef"
PATH = "/api/0123456789abcdef-1234567890/task-protection/v1/state"


class ProtectionAgent:
    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self.wall = wall
        self.enabled = False
        self.expires_at: float | None = None
        self.mode = ""
        self.hang_s = 3.0
        self.calls: list[tuple[str, dict[str, object] | None]] = []
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                agent._serve(self, "GET")

            def do_PUT(self) -> None:
                agent._serve(self, "PUT")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        # What ECS sets as ECS_AGENT_URI: the agent's address and this container's path
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}{PATH.removesuffix('/task-protection/v1/state')}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def protected(self) -> bool:
        """What ECS holds now: protection lapses at its expiration."""
        return self.enabled and self.expires_at is not None and self.wall() < self.expires_at

    def puts(self) -> list[dict[str, object] | None]:
        return [body for method, body in self.calls if method == "PUT"]

    def _serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        if handler.path != PATH:
            return _answer(handler, 404, {"error": {"Arn": "", "Code": "ResourceNotFoundException", "Message": "no"}})
        body = None
        if method == "PUT":
            raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        self.calls.append((method, body))
        if self.mode == "hang":
            time.sleep(self.hang_s)
        if self.mode == "garbage":
            return _answer(handler, 200, None, b"<html>agent</html>")
        if self.mode == "deny":
            message = f"User: arn:aws:sts::111122223333:assumed-role/task/x is not authorized to perform: " \
                      f"ecs:{'Update' if method == 'PUT' else 'Get'}TaskProtection on resource: {TASK_ARN}"  # fmt: skip
            return _answer(
                handler, 400, {"error": {"Arn": TASK_ARN, "Code": "AccessDeniedException", "Message": message}}
            )
        if self.mode == "failure":
            return _answer(handler, 200, {"failure": {"Arn": TASK_ARN, "Reason": "TASK_NOT_VALID",
                                                      "Detail": "The task is not part of a service."}})  # fmt: skip
        if method == "PUT":
            if not _valid(body):
                error = {
                    "Arn": "",
                    "Code": "InvalidParameterException",
                    "Message": "UpdateTaskProtection: failed to decode request",
                }
                return _answer(handler, 400, {"error": error})
            assert isinstance(body, dict)
            self.enabled = bool(body["ProtectionEnabled"])
            minutes = int(body.get("ExpiresInMinutes", 120))
            self.expires_at = self.wall() + 60 * minutes if self.enabled else None
        if not self.protected:
            self.enabled, self.expires_at = False, None
        expiration = None
        if self.expires_at is not None:
            expiration = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.expires_at)) + ".000Z"
        return _answer(handler, 200, {"protection": {"ExpirationDate": expiration, "ProtectionEnabled": self.enabled,
                                                     "TaskArn": TASK_ARN}})  # fmt: skip


def _valid(body: object) -> bool:
    if not isinstance(body, dict) or set(body) - {"ProtectionEnabled", "ExpiresInMinutes"}:
        return False
    if not isinstance(body.get("ProtectionEnabled"), bool):
        return False
    minutes = body.get("ExpiresInMinutes", 120)
    return isinstance(minutes, int) and 1 <= minutes <= 2880


def _answer(handler: BaseHTTPRequestHandler, status: int, doc: object, raw: bytes | None = None) -> None:
    data = raw if raw is not None else json.dumps(doc).encode()
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    except OSError:
        pass  # the client gave up (its deadline)
