"""A web chat's backend written from the docs: one engine per conversation, many at once.

Each conversation has its own session file and is resumed from it after a restart. The users
regenerate answers, edit earlier messages, switch the model between Anthropic (thinking), OpenAI
Responses (reasoning) and OpenAI Chat through an OpenAI-compatible gateway, press stop and
continue, type while the answer streams, paste huge texts, and write in every script and emoji.
The providers are mock servers (tests/host_wire.py) that refuse what the real APIs refuse. After
every step: the transcript is valid, the next request is accepted, nothing is left open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from agentloop import (
    Event,
    InterjectionInjected,
    Message,
    QueryEngine,
    TextDelta,
    ThinkingBlock,
    TurnEnded,
    TurnStarted,
    tool,
    validate_transcript,
)
from agentloop.models import AnthropicModel, Model, OpenAIChatModel, OpenAIResponsesModel
from agentloop.sessions import JsonlSession
from tests.host_wire import AnthropicServer, Call, ChatServer, Reply, ResponsesServer, _Server

ANTHROPIC_KEY = "sk-ant-api03-chat-never-shown-11aa"
OPENAI_KEY = "sk-proj-chat-never-shown-22bb"
ROUTER_KEY = "sk-or-v1-chat-never-shown-33cc"
ROUTER = "https://openrouter.ai/api/v1"

POLYGLOT = "Grüße, Ελλάδα, 日本語, עברית, العربية, हिन्दी 👩🏽‍💻🇯🇵 ✨"


@tool(concurrency_safe=True)
async def weather(city: str) -> str:
    """Look up today's weather of a city."""
    return f"{city}: ☀️ 21 °C"


def anthropic(server: AnthropicServer) -> AnthropicModel:
    return AnthropicModel("claude-opus-4-7", api_key=server.key, thinking=2000, http_client=server.client())


def responses(server: ResponsesServer) -> OpenAIResponsesModel:
    return OpenAIResponsesModel("gpt-5", api_key=server.key, http_client=server.client(),
                                extra_body={"reasoning": {"effort": "low", "summary": "auto"}})


def router(server: ChatServer) -> OpenAIChatModel:
    return OpenAIChatModel("google/gemini-2.5-flash", api_key=server.key, base_url=ROUTER, http_client=server.client())


def serve(provider: str, replies: list[Reply]) -> tuple[_Server, Model]:
    """A mock server of `provider` with `replies`, and a model that talks to it."""
    if provider == "anthropic":
        claude = AnthropicServer(ANTHROPIC_KEY, replies)
        return claude, anthropic(claude)
    if provider == "responses":
        gpt = ResponsesServer(OPENAI_KEY, replies)
        return gpt, responses(gpt)
    gateway = ChatServer(ROUTER_KEY, replies, path="/api/v1/chat/completions")
    return gateway, router(gateway)


async def drive(engine: QueryEngine, prompt: str | None = None) -> tuple[list[Event], TurnEnded]:
    async with contextlib.aclosing(engine.run(prompt)) as run:
        events = [event async for event in run]
    ends = [e for e in events if isinstance(e, TurnEnded)]
    return events, ends[-1]


def settled(engine: QueryEngine, *servers: _Server) -> None:
    """What every step must leave: a valid transcript, no run, no response open, nothing refused."""
    assert validate_transcript(engine.messages) == []
    assert not engine.running
    assert engine.session_errors == []
    for server in servers:
        assert server.rejections == []
        assert server.open_responses == 0


class Conversation:
    """One chat: its engine, over its own session file."""

    def __init__(self, path: Path, model: Model, *, resume: bool = False) -> None:
        if resume:
            self.session, loaded = JsonlSession.resume(path)
            assert loaded.warnings == [] and loaded.repairs == []
            messages = loaded.messages
        else:
            self.session, messages = JsonlSession(path), []
        self.engine = QueryEngine(model, tools=[weather], system="You are a friendly chat assistant.",
                                  session=self.session, messages=messages)

    def close(self) -> None:
        self.session.close()


# -- many conversations, a restart ----------------------------------------------------------------


async def test_many_conversations_at_once_then_a_restart_resumes_each_from_its_file(tmp_path: Path) -> None:
    server = AnthropicServer(ANTHROPIC_KEY, [])
    users = [f"user {n} {POLYGLOT}" for n in range(6)]
    server.on_request = lambda body: server.replies.append(
        Reply(thinking="Let me think… 🤔", text=f"Hello {body['messages'][-1]['content'][0]['text'][:6]} 👋", chunk=3)
    )
    model = anthropic(server)
    chats = [Conversation(tmp_path / f"chat-{n}.jsonl", model) for n in range(6)]
    results = await asyncio.gather(*(drive(c.engine, users[n]) for n, c in enumerate(chats)))
    for n, (_, end) in enumerate(results):
        assert end.reason == "completed"
        assert chats[n].engine.messages[0].text == users[n]
        assert chats[n].engine.messages[-1].text == f"Hello user {n} 👋"
        settled(chats[n].engine, server)
        chats[n].close()

    # The server restarts: new engines from the files, the same conversations.
    model = anthropic(server)
    again = [Conversation(tmp_path / f"chat-{n}.jsonl", model, resume=True) for n in range(6)]
    await asyncio.gather(*(drive(c.engine, f"and again, {n} 🔁") for n, c in enumerate(again)))
    for n, chat in enumerate(again):
        assert [m.role for m in chat.engine.messages] == ["user", "assistant", "user", "assistant"]
        assert chat.engine.messages[0].text == users[n]
        assert isinstance(chat.engine.messages[1].content[0], ThinkingBlock)
        settled(chat.engine, server)
        chat.close()
        assert JsonlSession(tmp_path / f"chat-{n}.jsonl").load().messages == chat.engine.messages
    sent = [b for b in server.bodies if len(b["messages"]) == 3]
    assert len(sent) == 6 and all(b["messages"][1]["content"][0]["type"] == "thinking" for b in sent)
    await model.aclose()


# -- regenerate, edit -------------------------------------------------------------------------------


def rewind_to_last_prompt(engine: QueryEngine) -> None:
    """Regenerate: drop everything after the user's last own message (not a tool result)."""
    last = max(i for i, m in enumerate(engine.messages) if m.role == "user" and not m.synthetic and m.text)
    del engine.messages[last + 1 :]


@pytest.mark.parametrize("provider", ["anthropic", "responses", "router"])
async def test_regenerate_the_last_answer_and_edit_an_earlier_message(provider: str, tmp_path: Path) -> None:
    server, model = serve(provider, [
        Reply(thinking="Weather first.", text="Checking 🌦", calls=[Call("weather", {"city": "Zürich"})]),
        Reply(thinking="Got it.", text="Zürich: ☀️ 21 °C."),
        Reply(thinking="Again.", text="Regenerated: sunny in Zürich ☀️."),
        Reply(text="Tokyo 東京 is next."),
        Reply(thinking="Edited.", text="In Kraków it is sunny too."),
    ])
    path = tmp_path / "chat.jsonl"
    chat = Conversation(path, model)
    engine = chat.engine
    await drive(engine, "Wie ist das Wetter in Zürich? 🌍")
    assert engine.messages[-1].text == "Zürich: ☀️ 21 °C."

    rewind_to_last_prompt(engine)
    assert engine.messages[-1].role == "user"
    _, end = await drive(engine)
    assert end.reason == "completed"
    assert engine.messages[-1].text == "Regenerated: sunny in Zürich ☀️."
    assert len(engine.messages) == 2
    settled(engine, server)

    await drive(engine, "And Tokyo?")
    # Edit the first message and continue from there: everything after it goes.
    engine.messages[0] = Message.user("Wie ist das Wetter in Kraków? 🇵🇱")
    del engine.messages[1:]
    _, end = await drive(engine)
    assert end.reason == "completed"
    assert [m.text for m in engine.messages] == ["Wie ist das Wetter in Kraków? 🇵🇱", "In Kraków it is sunny too."]
    settled(engine, server)
    chat.close()
    assert JsonlSession(path).load().messages == engine.messages


# -- switching the model ------------------------------------------------------------------------------


async def test_switching_anthropic_thinking_to_responses_reasoning_to_a_chat_gateway(tmp_path: Path) -> None:
    claude = AnthropicServer(ANTHROPIC_KEY, [
        Reply(thinking="The user wants weather.", calls=[Call("weather", {"city": "Αθήνα"})]),
        Reply(thinking="Answer now.", text="Αθήνα: ☀️ 21 °C."),
    ])
    gpt = ResponsesServer(OPENAI_KEY, [
        Reply(thinking="Another city.", calls=[Call("weather", {"city": "القاهرة"})]),
        Reply(thinking="Summarise.", text="القاهرة: ☀️ 21 °C."),
    ])
    gateway = ChatServer(ROUTER_KEY, [
        Reply(thinking="Compare.", calls=[Call("weather", {"city": "मुंबई"})]),
        Reply(text="All three are sunny 😎."),
    ], path="/api/v1/chat/completions")
    chat = Conversation(tmp_path / "chat.jsonl", anthropic(claude))
    engine = chat.engine
    await drive(engine, "Weather in Athens?")
    settled(engine, claude)
    engine.model = responses(gpt)
    await drive(engine, "And Cairo?")
    settled(engine, gpt)
    engine.model = router(gateway)
    _, end = await drive(engine, "And Mumbai? Compare them.")
    assert end.reason == "completed"
    settled(engine, gateway)
    engine.model = anthropic(claude)  # and back to where it began
    claude.replies.append(Reply(thinking="Done.", text="Anything else? 🙂"))
    await drive(engine, "Thanks!")
    settled(engine, claude)
    last = claude.bodies[-1]["messages"]
    assert [b["type"] for b in last[1]["content"]][:1] == ["thinking"]  # its own thinking goes back
    chat.close()


# -- stop, continue, typing while it streams ---------------------------------------------------------


@pytest.mark.parametrize("provider", ["anthropic", "responses", "router"])
@pytest.mark.parametrize("where", ["thinking", "text"])
async def test_stop_generating_then_continue(provider: str, where: str, tmp_path: Path) -> None:
    story = "Once upon a time 🏰 a fox met a crow, who held a piece of cheese in her beak…"
    reply = Reply(thinking="Which story? Maybe Aesop's, in Greek: Αίσωπος 🦊", text=story, chunk=5,
                  stall_after=2 if where == "thinking" else 13)
    server, model = serve(provider, [reply])
    chat = Conversation(tmp_path / "chat.jsonl", model)
    engine = chat.engine
    run = engine.run("Tell me a story ✨")
    task = asyncio.create_task(drive_run(run))
    await server.stalled.wait()
    engine.interrupt()  # the stop button
    end = await task
    assert end.reason == "aborted_streaming"
    assert engine.messages[-1].kind == "interrupt_notice"
    settled(engine, server)

    server.replies.append(Reply(text="…and they lived happily ever after. 🌈"))
    _, end = await drive(engine, "continue")
    assert end.reason == "completed"
    assert engine.messages[-1].text.endswith("🌈")
    settled(engine, server)
    chat.close()


async def drive_run(run: Any) -> TurnEnded:
    async with contextlib.aclosing(run):
        events = [event async for event in run]
    return [e for e in events if isinstance(e, TurnEnded)][-1]


@pytest.mark.parametrize("provider", ["anthropic", "responses", "router"])
async def test_typing_while_it_streams_interject_then_send_now(provider: str, tmp_path: Path) -> None:
    server, model = serve(provider, [
        Reply(thinking="Planning.", text="Here is a recipe for Käsespätzle: first… " * 3, chunk=6),
        Reply(thinking="Adjust.", text="Vegan Käsespätzle: use oat milk 🥛."),
        Reply(text="Ramen 🍜 it is: boil the noodles…", chunk=4, stall_after=2),
        Reply(thinking="Switch.", text="Pho 🍲: start with the broth."),
    ])
    chat = Conversation(tmp_path / "chat.jsonl", model)
    engine = chat.engine
    receipt = ""
    events: list[Event] = []
    async with contextlib.aclosing(engine.run("A recipe please 🍽")) as run:
        async for event in run:
            events.append(event)
            if isinstance(event, TextDelta) and not receipt:
                receipt = engine.interject("Make it vegan 🌱")
    injected = [e for e in events if isinstance(e, InterjectionInjected)]
    assert [e.ids for e in injected] == [(receipt,)]
    assert "Make it vegan 🌱" in json.dumps(server.bodies[1], ensure_ascii=False)
    assert "Make it vegan 🌱" not in json.dumps(server.bodies[0], ensure_ascii=False)
    assert engine.messages[-1].text == "Vegan Käsespätzle: use oat milk 🥛."
    settled(engine, server)

    server.stalled.clear()
    run = engine.run("Now a soup")
    task = asyncio.create_task(collect_events(run))
    await server.stalled.wait()
    engine.send_now("Actually, pho instead 🍲")
    events = await task
    starts = [e for e in events if isinstance(e, TurnStarted)]
    assert len(starts) == 2
    assert engine.messages[-1].text == "Pho 🍲: start with the broth."
    settled(engine, server)
    chat.close()


async def collect_events(run: Any) -> list[Event]:
    async with contextlib.aclosing(run):
        return [event async for event in run]


# -- huge and odd messages ------------------------------------------------------------------------


class LimitedAnthropic(AnthropicServer):
    """Refuses a request whose text is longer than its context window, as Anthropic does."""

    def check(self, body: dict[str, Any]) -> str | None:
        size = len(json.dumps(body["messages"], ensure_ascii=False))
        if size > 200_000:
            return f"prompt is too long: {size // 3} tokens > 50000 maximum"
        return super().check(body)


async def test_a_huge_pasted_message_is_refused_then_the_user_edits_it(tmp_path: Path) -> None:
    server = LimitedAnthropic(ANTHROPIC_KEY, [Reply(text="Short enough now 👍")])
    chat = Conversation(tmp_path / "chat.jsonl", anthropic(server))
    engine = chat.engine
    huge = ("Lorem ipsum 😀 dolor sit amet, Ünïcödé. " * 10_000).strip()
    _, end = await drive(engine, huge)
    assert end.reason == "prompt_too_long"
    assert server.rejections and "prompt is too long" in server.rejections[0]
    server.rejections.clear()
    assert validate_transcript(engine.messages) == []
    # The user shortens the message and sends it again, replacing the huge one.
    del engine.messages[-1:]
    _, end = await drive(engine, huge[:2000])
    assert end.reason == "completed"
    assert [m.role for m in engine.messages] == ["user", "assistant"]
    settled(engine, server)
    chat.close()
    assert JsonlSession(tmp_path / "chat.jsonl").load().messages == engine.messages


@pytest.mark.parametrize("provider", ["responses", "router"])
async def test_claude_with_thinking_takes_over_a_tool_turn_another_model_began(provider: str) -> None:
    """The user picks Claude after the other model's turn stopped on its tool results (here by
    `max_turns`; a failed request does the same) and presses retry: the assistant turn those
    results answer has no thinking of Claude's, which Anthropic requires with thinking on."""
    server: _Server
    if provider == "responses":
        server = ResponsesServer(OPENAI_KEY, [Reply(thinking="Look it up.", text="Checking 🔎",
                                                    calls=[Call("weather", {"city": "Reykjavík"})])])
        model: Model = responses(server)
    else:
        server = ChatServer(ROUTER_KEY, [Reply(text="Checking 🔎", calls=[Call("weather", {"city": "Reykjavík"})])],
                            path="/api/v1/chat/completions")
        model = router(server)
    engine = QueryEngine(model, tools=[weather], max_turns=1)
    _, end = await drive(engine, "Weather in Reykjavík? ❄️")
    assert end.reason == "max_turns"
    settled(engine, server)
    claude = AnthropicServer(ANTHROPIC_KEY, [Reply(thinking="Done.", text="Reykjavík: ☀️ 21 °C.")])
    engine.model = anthropic(claude)
    _, end = await drive(engine)
    assert end.reason == "completed", end.error
    assert engine.messages[-1].text == "Reykjavík: ☀️ 21 °C."
    settled(engine, claude)
    # Thinking is left off for that one request only; the next turn has it again.
    assert "thinking" not in claude.bodies[0]
    claude.replies.append(Reply(thinking="Easy.", text="Bring a coat 🧥."))
    await drive(engine, "What should I wear?")
    assert claude.bodies[1]["thinking"] == {"type": "enabled", "budget_tokens": 2000}
    settled(engine, claude)


async def test_the_model_switched_while_a_tool_runs_answers_the_results() -> None:
    """A run in progress picks up `engine.model` at its next request (quickstart.md): the user
    picks Claude with thinking from the menu while the other model's tool call runs."""
    gpt, model = serve("responses", [Reply(thinking="Look.", calls=[Call("weather", {"city": "Genève"})])])
    claude = AnthropicServer(ANTHROPIC_KEY, [Reply(thinking="Results in.", text="Genève: ☀️ 21 °C.")])
    engine = QueryEngine(model, tools=[weather])
    async with contextlib.aclosing(engine.run("Météo à Genève ?")) as run:
        async for event in run:
            if event.type == "tool_call_started":
                engine.model = anthropic(claude)
            if isinstance(event, TurnEnded):
                assert event.reason == "completed", event.error
    assert engine.messages[-1].text == "Genève: ☀️ 21 °C."
    settled(engine, gpt, claude)


@pytest.mark.parametrize("provider", ["anthropic", "responses", "router"])
async def test_regenerate_pressed_while_the_answer_streams(provider: str, tmp_path: Path) -> None:
    """The host stops the run, waits for its task, then rewinds (cookbook.md): the model is asked
    the user's question again, not the interrupt notice."""
    server, model = serve(provider, [
        Reply(thinking="Hmm.", text="Der Rhein fließt durch sechs Länder 🇨🇭🇱🇮🇦🇹🇩🇪🇫🇷🇳🇱", chunk=4, stall_after=6),
        Reply(thinking="Again.", text="Der Rhein: 1.233 km 🌊"),
    ])
    chat = Conversation(tmp_path / "chat.jsonl", model)
    engine = chat.engine
    task = asyncio.create_task(drive_run(engine.run("Erzähl mir vom Rhein")))
    await server.stalled.wait()
    engine.interrupt()
    assert (await task).reason == "aborted_streaming"
    rewind_to_last_prompt(engine)
    _, end = await drive(engine)
    assert end.reason == "completed"
    assert [m.text for m in engine.messages] == ["Erzähl mir vom Rhein", "Der Rhein: 1.233 km 🌊"]
    assert "interrupted" not in json.dumps(server.bodies[-1], ensure_ascii=False)
    settled(engine, server)
    chat.close()
    assert JsonlSession(tmp_path / "chat.jsonl").load().messages == engine.messages


# -- every moment -------------------------------------------------------------------------------------

PROVIDERS = ["anthropic", "responses", "router"]


def weather_script(text: str = "Checking…") -> list[Reply]:
    """A tool turn (reasoning, `text` if any, two calls), then the answer."""
    return [
        Reply(thinking="Let me look it up 🔎", text=text, chunk=6,
              calls=[Call("weather", {"city": "Zürich"}), Call("weather", {"city": "Oslo"})]),
        Reply(thinking="Both in.", text="Zürich and Oslo: ☀️.", chunk=6),
    ]


async def act_at(engine: QueryEngine, prompt: str, k: int, action: str, switch_to: Model | None = None) -> None:
    """Iterates a run, doing `action` at its `k`-th event (as a user's click lands anywhere)."""
    async with contextlib.aclosing(engine.run(prompt)) as run:
        async for n, _ in aenumerate(run):
            if n != k:
                continue
            if action == "interrupt":
                engine.interrupt()
            elif action == "send_now":
                engine.send_now("Just Oslo, please 🇳🇴")
            elif action == "interject":
                engine.interject("In Fahrenheit 🌡")
            elif action == "switch" and switch_to is not None:
                engine.model = switch_to
            elif action == "break":
                break


async def aenumerate(run: Any) -> Any:
    n = 0
    async for event in run:
        yield n, event
        n += 1


@pytest.mark.parametrize("first", PROVIDERS)
@pytest.mark.parametrize("then", PROVIDERS)
async def test_a_click_at_every_event_then_the_other_model_continues(first: str, then: str) -> None:
    """Stop, send now, steer or a model switch at each event of a tool turn on one provider, then
    "continue" on another: every transcript is valid and every request is accepted."""
    server, model = serve(first, weather_script(text=""))
    events = len([e async for e in QueryEngine(model, tools=[weather]).run("Weather?")])
    for action in ("interrupt", "send_now", "interject", "switch"):
        for k in range(events):
            server, model = serve(first, weather_script(text=""))  # the calls right after the reasoning
            switched, switch_to = serve(then, [Reply(thinking="Mine now.", text="Switched ✅")] * 3)
            engine = QueryEngine(model, tools=[weather])
            await act_at(engine, "Weather in Zürich and Oslo? 🌍", k, action, switch_to)
            assert validate_transcript(engine.messages) == [], (action, k)
            after, engine.model = serve(then, [Reply(thinking="Continuing.", text="Here you go ✅")] * 3)
            _, end = await drive(engine, "continue")
            assert end.reason == "completed", (action, k, end.error)
            settled(engine, server, switched, after)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("action", ["interrupt", "send_now", "break", "edit"])
async def test_regenerate_or_edit_after_a_click_at_every_event_then_a_restart(
    provider: str, action: str, tmp_path: Path
) -> None:
    """After a click at any event, regenerate (or edit the first message): the file replays to
    the transcript, resumes without repairs, and the conversation goes on."""
    greeting = [Reply(text="Hi there 👋")]
    server, model = serve(provider, [*greeting, *weather_script()])
    probe = QueryEngine(model, tools=[weather])
    await drive(probe, "Hello")
    events = len([e async for e in probe.run("Weather?")])
    for k in range(events):
        server, model = serve(provider, [*greeting, *weather_script(), *[Reply(thinking="Again.", text="Redone ✅")] * 4])
        path = tmp_path / f"chat-{k}.jsonl"
        chat = Conversation(path, model)
        await drive(chat.engine, "Hello")
        await act_at(chat.engine, "Weather in Zürich and Oslo? 🌍", k, action)
        if action == "edit":
            chat.engine.messages[0] = Message.user("Hallo (edited) ✏️")
            del chat.engine.messages[1:]
        else:
            rewind_to_last_prompt(chat.engine)
        _, end = await drive(chat.engine)
        assert end.reason == "completed", (k, end.error)
        settled(chat.engine, server)
        chat.close()
        again = Conversation(path, model, resume=True)  # asserts: no warnings, no repairs
        assert again.engine.messages == chat.engine.messages
        _, end = await drive(again.engine, "Danke! 🙏")
        assert end.reason == "completed"
        settled(again.engine, server)
        again.close()
