"""An MCP server over stdio written at the wire level, for the tests of `agentloop.mcp` that need
what the SDK's server never does: messages split across writes or joined in one, lines that are
not JSON, requests to the client, a server that exits at a chosen moment.

    python mcp_raw_server.py [--starts FILE] [--die-after-init-from N] [--version V] [--noise]

``--starts FILE`` appends one line per start; ``--die-after-init-from N`` makes the N-th start
(and every later one) exit right after answering ``initialize``; ``--version V`` answers
``initialize`` with protocol version V; ``--noise`` prints a banner before the first answer; ``--changes-on-list`` says the tool list
changed at every ``tools/list``; ``--methods FILE`` appends the method of each message received;
``--mute-init-from N`` / ``--mute-list-from N`` make the N-th start (and every later one) never
answer ``initialize`` / ``tools/list``; ``--bad-tools`` lists, among the tools, some whose
entries are not valid tools.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

out = sys.stdout.buffer
answers: dict[Any, dict[str, Any]] = {}  # the client's answers to our requests, by id

TOOLS = [
    "split", "joined", "big", "noise", "ping", "roots", "exit", "stderr", "pid", "changes", "batch", "deaf", "last", "deep",
    "latin1", "surrogate", "bad_error", "bad_result", "new_content", "deep_answer", "cut_answer",
    "cut_before_id",
]  # fmt: skip


def send(message: dict[str, Any] | list[dict[str, Any]]) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def receive() -> dict[str, Any]:
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit(0)
    message: dict[str, Any] = json.loads(line)
    return message


def ask(request_id: str, method: str) -> dict[str, Any]:
    """Send the client a request and wait for its answer (other messages are kept)."""
    send({"jsonrpc": "2.0", "id": request_id, "method": method})
    while request_id not in answers:
        message = receive()
        if "method" not in message:
            answers[message.get("id")] = message
    return answers.pop(request_id)


def text(request_id: Any, value: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": value}]}}


def call(request_id: Any, name: str, arguments: dict[str, Any]) -> None:
    if name == "split":  # one message in writes of 7 bytes (a multi-byte character is cut too)
        data = json.dumps(text(request_id, "héllo, split"), ensure_ascii=False).encode() + b"\n"
        for i in range(0, len(data), 7):
            out.write(data[i : i + 7])
            out.flush()
            time.sleep(0.001)
    elif name == "joined":  # a notification and the answer in one write
        note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
        out.write(json.dumps(note).encode() + b"\n" + json.dumps(text(request_id, "joined")).encode() + b"\n")
        out.flush()
    elif name == "big":
        send(text(request_id, "x" * int(arguments.get("n", 1 << 20))))
    elif name == "noise":  # a print() meant for a terminal, a blank line, a CRLF line ending
        out.write(b"processing the request...\n\n\r\n")
        out.write(json.dumps(text(request_id, "after the noise")).encode() + b"\r\n")
        out.flush()
    elif name in ("ping", "roots"):
        answer = ask(f"{name}-1", "ping" if name == "ping" else "roots/list")
        send(text(request_id, json.dumps({k: answer[k] for k in ("result", "error") if k in answer})))
    elif name == "exit":  # dies in the middle of the call
        if arguments.get("orphan"):  # leaving behind a process that holds its stdout open
            orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            Path(arguments["orphan"]).write_text(str(orphan.pid))
        os._exit(int(arguments.get("code", 1)))
    elif name == "stderr":
        sys.stderr.write(str(arguments.get("text", "")))
        sys.stderr.flush()
        send(text(request_id, "written"))
    elif name == "pid":
        send(text(request_id, str(os.getpid())))
    elif name == "batch":  # a JSON-RPC batch (protocol 2025-03-26): a notification, a request, the answer
        note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
        send([note, {"jsonrpc": "2.0", "id": "batch-ping", "method": "ping"}])
        while "batch-ping" not in answers:
            message = receive()
            if "method" not in message:
                answers[message.get("id")] = message
        pong = answers.pop("batch-ping")
        send([text(request_id, json.dumps(pong.get("result")))])
    elif name == "deaf":  # reads no more of its stdin (nor answers), once it has said so in a file
        Path(arguments["deaf"]).write_text("deaf\n")
        time.sleep(60)
    elif name == "deep":  # a line of JSON nested too deeply to decode, then the answer
        out.write(b"[" * 1000 + b"]" * 1000 + b"\n")
        send(text(request_id, "after the deep line"))
    elif name == "latin1":  # an answer whose text is Latin-1, not UTF-8
        out.write(b'{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"caf\xe9"}]}}\n' % json.dumps(request_id).encode())
        out.flush()
    elif name == "surrogate":  # an answer whose text holds a lone UTF-16 surrogate (valid JSON, no valid Unicode)
        send(text(request_id, "a\ud800b"))
    elif name in ("deep_answer", "cut_answer"):  # nested past any parser's depth; cut short, then a line break
        answer = json.dumps(text(request_id, "x")).encode()
        if name == "deep_answer":
            depth = int(arguments.get("n", 1000))
            answer = answer[:-1] + b',"structuredContent":{"a":' + b"[" * depth + b"]" * depth + b"}}"
        out.write((answer if name == "deep_answer" else answer[:40]) + b"\n")
        out.flush()
    elif name == "cut_before_id":  # an answer whose id comes after its result, cut short before the id
        answer = {"jsonrpc": "2.0", "result": {"content": [{"type": "text", "text": "x"}]}, "id": request_id}
        whole = json.dumps(answer).encode()
        out.write(whole[: whole.rindex(b'"id"')] + b"\n")
        out.flush()
    elif name == "bad_error":  # an error answer whose code is not a number
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": "oops", "message": "went wrong"}})
    elif name == "bad_result":  # a result whose content is not a list
        send({"jsonrpc": "2.0", "id": request_id, "result": {"content": 5}})
    elif name == "new_content":  # a content type of a later protocol (or of sampling only), between two texts
        block = {"type": arguments.get("type", "hologram"), "data": "...", "id": "u1", "name": "n", "input": {}}
        content = [{"type": "text", "text": "before"}, block, {"type": "text", "text": "after"}]
        send({"jsonrpc": "2.0", "id": request_id, "result": {"content": content}})
    elif name == "last":  # answers, and exits at once
        send(text(request_id, "the last answer"))
        os._exit(0)
    elif name == "changes":  # the tool list changed
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        send(text(request_id, "changed"))
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": f"unknown tool {name}"}})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=Path)
    parser.add_argument("--die-after-init-from", type=int, default=0)
    parser.add_argument("--version", default="")
    parser.add_argument("--noise", action="store_true")
    parser.add_argument("--changes-on-list", action="store_true", help="every tools/list says the list changed")
    parser.add_argument("--methods", type=Path, help="a file to append the method of each message received to")
    parser.add_argument("--mute-init-from", type=int, default=0)
    parser.add_argument("--mute-list-from", type=int, default=0)
    parser.add_argument("--bad-tools", action="store_true", help="list tools of invalid shapes among the others")
    args = parser.parse_args()
    start = 1
    if args.starts is not None:
        with args.starts.open("a+") as f:
            f.seek(0)
            start = len(f.read().splitlines()) + 1
            f.write(f"{os.getpid()}\n")
    if args.noise:
        out.write(b"my-server v1.0 listening on stdio\n")
        out.flush()
    while True:
        message = receive()
        method = message.get("method")
        if args.methods is not None:
            with args.methods.open("a") as f:
                f.write(f"{method}\n")
        if method is None:
            answers[message.get("id")] = message
        elif 0 < {"initialize": args.mute_init_from, "tools/list": args.mute_list_from}.get(method, 0) <= start:
            continue  # never answered
        elif method == "initialize":
            version = args.version or message["params"]["protocolVersion"]
            info = {"name": "raw", "version": "1"}
            send({"jsonrpc": "2.0", "id": message["id"],
                  "result": {"protocolVersion": version, "capabilities": {"tools": {"listChanged": True}}, "serverInfo": info}})  # fmt: skip
            if args.die_after_init_from and start >= args.die_after_init_from:
                os._exit(0)
        elif method == "tools/list":
            if args.changes_on_list:
                send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
            tools: list[Any] = [{"name": name, "inputSchema": {"type": "object"}} for name in TOOLS]
            if args.bad_tools:  # tools no client can read: a schema of the wrong shape, not a tool at all
                tools[1:1] = [{"name": "bad", "inputSchema": {"type": "object", "properties": 5}}, {"nom": "x"}, 7]
            send({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": tools}})
        elif method == "tools/call":
            call(message["id"], message["params"]["name"], message["params"].get("arguments") or {})
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": message["id"], "result": {}})


if __name__ == "__main__":
    main()
