"""The offline model, driven through the official anthropic SDK the way Workbench drives Claude."""

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from offline_model.script import find_script, parse_script, split_tokens
from offline_model.testing import OfflineModel, start_offline_model

MODEL = "claude-offline"


@pytest.fixture(scope="module")
def offline_model() -> Iterator[OfflineModel]:
    with start_offline_model() as model:
        yield model


@pytest.fixture
def model(offline_model: OfflineModel) -> OfflineModel:
    offline_model.reset()
    return offline_model


@pytest.fixture
def client(model: OfflineModel) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=model.base_url, api_key="test", max_retries=0)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def create(client: anthropic.Anthropic, messages: list[dict[str, Any]], **options: Any) -> Any:
    return client.messages.create(model=MODEL, max_tokens=1024, messages=messages, **options)


def stream_final(client: anthropic.Anthropic, messages: list[dict[str, Any]], **options: Any) -> Any:
    with client.messages.stream(model=MODEL, max_tokens=1024, messages=messages, **options) as stream:
        return stream.get_final_message()


def answer_tool_call(messages: list[dict[str, Any]], reply: Any, result: str) -> list[dict[str, Any]]:
    """The conversation after the assistant's tool call and the platform's tool result."""
    call = next(block for block in reply.content if block.type == "tool_use")
    return [
        *messages,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": result}]},
    ]


def test_plain_message_is_echoed_with_end_turn_and_word_usage(client: anthropic.Anthropic) -> None:
    reply = create(client, [user("hello offline world")])

    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == "You said: hello offline world"
    assert reply.stop_reason == "end_turn"
    assert reply.usage.output_tokens == 5
    assert reply.usage.input_tokens >= 3
    assert reply.usage.cache_read_input_tokens == 0


def test_streamed_answer_follows_the_real_event_order(client: anthropic.Anthropic) -> None:
    events = list(create(client, [user("hello offline world")], stream=True))

    assert [event.type for event in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 5,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(event.delta.text for event in events[2:7]) == "You said: hello offline world"
    assert events[-2].delta.stop_reason == "end_turn"
    assert events[-2].usage.output_tokens == 5


def test_stream_helper_yields_text_and_the_final_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model=MODEL, max_tokens=1024, messages=[user("hi there")]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()

    assert text == "You said: hi there"
    assert final.content[0].text == text
    assert final.stop_reason == "end_turn"


def test_bash_line_calls_bash_then_quotes_the_tool_result(client: anthropic.Anthropic) -> None:
    messages = [user("please list\n/bash ls -la /tmp")]

    call = stream_final(client, messages)
    assert call.stop_reason == "tool_use"
    assert [block.type for block in call.content] == ["text", "tool_use"]
    assert call.content[1].name == "bash"
    assert call.content[1].input == {"command": "ls -la /tmp"}
    assert call.content[1].id.startswith("toolu_")

    answer = stream_final(client, answer_tool_call(messages, call, "total 0"))
    assert answer.stop_reason == "end_turn"
    assert answer.content[-1].text == "Result of bash: total 0"


def test_two_bash_lines_make_two_calls_in_order_then_answer(client: anthropic.Anthropic) -> None:
    messages = [user("/bash echo one\n/bash echo two")]

    first = create(client, messages)
    messages = answer_tool_call(messages, first, "one")
    second = create(client, messages)
    messages = answer_tool_call(messages, second, "two")
    answer = create(client, messages)

    assert first.content[-1].input == {"command": "echo one"}
    assert second.content[-1].input == {"command": "echo two"}
    assert first.content[-1].id != second.content[-1].id
    assert answer.stop_reason == "end_turn"
    assert answer.content[-1].text == "Result of bash: one\nResult of bash: two"


def test_tool_line_calls_a_tool_missing_from_the_tools_list_with_its_json(
    client: anthropic.Anthropic,
) -> None:
    tools = [{"name": "bash", "description": "Run a command", "input_schema": {"type": "object"}}]
    messages = [user('/tool write_file {"path": "notes/a b.txt", "lines": [1, 2], "append": true}')]

    streamed = stream_final(client, messages, tools=tools)
    plain = create(client, messages, tools=tools)

    expected = {"path": "notes/a b.txt", "lines": [1, 2], "append": True}
    assert streamed.content[-1].name == plain.content[-1].name == "write_file"
    assert streamed.content[-1].input == plain.content[-1].input == expected


def test_tool_error_results_are_quoted_as_errors(client: anthropic.Anthropic) -> None:
    messages = [user("/bash false")]
    call = create(client, messages)
    messages = answer_tool_call(messages, call, "exit 1")
    messages[-1]["content"][0]["is_error"] = True

    assert create(client, messages).content[-1].text == "Error from bash: exit 1"


def test_tool_line_with_invalid_json_is_answered_with_an_explanation(client: anthropic.Anthropic) -> None:
    reply = create(client, [user('/tool write_file {"path": ')])

    assert reply.stop_reason == "end_turn"
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text.startswith("Cannot call tool write_file: its input is not valid JSON")


def test_think_line_begins_the_answer_with_a_signed_thinking_block(client: anthropic.Anthropic) -> None:
    events = list(create(client, [user("/think weighing options\nhello")], stream=True))
    final = stream_final(client, [user("/think weighing options\nhello")])

    delta_types = [event.delta.type for event in events if event.type == "content_block_delta"]
    assert delta_types[:3] == ["thinking_delta", "thinking_delta", "signature_delta"]
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "weighing options"
    assert final.content[0].signature


def test_long_line_answers_with_that_many_words(client: anthropic.Anthropic) -> None:
    reply = create(client, [user("/long 250")])

    assert len(reply.content[0].text.split()) == 250
    assert reply.usage.output_tokens == 250


def test_answer_stops_at_max_tokens(client: anthropic.Anthropic) -> None:
    messages = [user("/long 50")]
    plain = client.messages.create(model=MODEL, max_tokens=7, messages=messages)
    with client.messages.stream(model=MODEL, max_tokens=7, messages=messages) as stream:
        streamed = stream.get_final_message()

    for reply in (plain, streamed):
        assert reply.stop_reason == "max_tokens"
        assert reply.usage.output_tokens == 7
        assert len(reply.content[0].text.split()) == 7


def test_tool_call_that_does_not_fit_max_tokens_is_left_out(client: anthropic.Anthropic) -> None:
    reply = client.messages.create(model=MODEL, max_tokens=3, messages=[user("/bash ls -la /tmp")])

    assert reply.stop_reason == "max_tokens"
    assert [block.type for block in reply.content] == ["text"]


def test_injected_529_fails_the_next_two_requests_then_succeeds(
    model: OfflineModel, client: anthropic.Anthropic
) -> None:
    model.inject_fault("529", count=2)

    for _ in range(2):
        with pytest.raises(anthropic.OverloadedError) as raised:
            create(client, [user("hi")])
        assert raised.value.body["error"]["type"] == "overloaded_error"
        assert raised.value.response.headers["retry-after"] == "0"
    assert create(client, [user("hi")]).stop_reason == "end_turn"
    assert model.stats()["by_status"] == {"200": 1, "529": 2}


def test_sdk_retries_through_injected_529s_by_itself(model: OfflineModel) -> None:
    retrying = anthropic.Anthropic(base_url=model.base_url, api_key="test", max_retries=2)
    model.inject_fault("529", count=2)

    assert stream_final(retrying, [user("hi")]).content[0].text == "You said: hi"
    # The server counts a streamed reply once its handler ends, which may be after the client has read it all.
    deadline = time.monotonic() + 5
    while model.stats()["requests"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert model.stats()["by_status"] == {"200": 1, "529": 2}


@pytest.mark.parametrize(
    ("kind", "error_class", "error_type"),
    [
        ("429", anthropic.RateLimitError, "rate_limit_error"),
        ("500", anthropic.InternalServerError, "api_error"),
    ],
)
def test_injected_status_faults_use_the_real_error_envelope(
    model: OfflineModel, client: anthropic.Anthropic, kind: str, error_class: type, error_type: str
) -> None:
    model.inject_fault(kind)

    with pytest.raises(error_class) as raised:
        create(client, [user("hi")], stream=True)

    assert raised.value.body["type"] == "error"
    assert raised.value.body["error"]["type"] == error_type
    assert raised.value.request_id.startswith("req_")


def test_broken_stream_raises_in_the_sdk_mid_stream(model: OfflineModel, client: anthropic.Anthropic) -> None:
    model.inject_fault("broken_stream")
    received: list[str] = []

    with (
        pytest.raises((httpx2.RemoteProtocolError, anthropic.APIConnectionError)) as raised,
        client.messages.stream(model=MODEL, max_tokens=1024, messages=[user("hello there")]) as stream,
    ):
        received.extend(stream.text_stream)

    # The SDK raises the cut connection itself, or (from anthropic 2.17) an APIConnectionError caused by it.
    cut = raised.value if isinstance(raised.value, httpx2.RemoteProtocolError) else raised.value.__cause__
    assert isinstance(cut, httpx2.RemoteProtocolError), repr(raised.value)
    assert received == ["You"]
    assert stream_final(client, [user("hello there")]).stop_reason == "end_turn"


def test_first_text_delta_waits_at_least_the_configured_ttft(
    model: OfflineModel, client: anthropic.Anthropic
) -> None:
    model.set_latency(ttft_ms=300)

    started = time.monotonic()
    with client.messages.stream(model=MODEL, max_tokens=1024, messages=[user("hi")]) as stream:
        next(iter(stream.text_stream))
        first_text_after = time.monotonic() - started
    started = time.monotonic()
    create(client, [user("hi")])
    whole_reply_after = time.monotonic() - started

    assert first_text_after >= 0.3
    assert whole_reply_after >= 0.3


def test_deltas_are_paced_at_the_configured_tokens_per_second(
    model: OfflineModel, client: anthropic.Anthropic
) -> None:
    """The first token leaves at once, each of the other 20 a hundredth of a second after the one before."""
    model.set_latency(tps=100)

    started = time.monotonic()
    with client.messages.stream(model=MODEL, max_tokens=1024, messages=[user("/long 21")]) as stream:
        tokens = list(stream.text_stream)
    last_token_after = time.monotonic() - started

    assert len(tokens) == 21
    assert last_token_after >= 20 / 100


def test_sleep_line_delays_the_answer(client: anthropic.Anthropic) -> None:
    started = time.monotonic()
    reply = create(client, [user("/sleep 0.2\nhello")])

    assert time.monotonic() - started >= 0.2
    assert reply.content[0].text == "You said: /sleep 0.2\nhello"


def test_fifty_streams_are_served_at_the_same_time(model: OfflineModel, client: anthropic.Anthropic) -> None:
    """Each stream takes 0.2 s and every client holds its own open until all fifty have begun, so a
    server answering one at a time would need 10 s and break the 5 s barrier."""
    model.set_latency(tps=200)
    all_started = threading.Barrier(50, timeout=5)

    def one_session(number: int) -> str:
        with client.messages.stream(
            model=MODEL, max_tokens=1024, messages=[user(f"/long 41\n{number}")]
        ) as stream:
            next(iter(stream))
            all_started.wait()
            return stream.get_final_message().stop_reason

    with ThreadPoolExecutor(max_workers=50) as pool:
        stop_reasons = list(pool.map(one_session, range(50)))

    assert stop_reasons == ["end_turn"] * 50
    assert model.stats()["by_status"] == {"200": 50}


def test_client_hanging_up_mid_stream_ends_the_server_side_stream(
    model: OfflineModel, client: anthropic.Anthropic
) -> None:
    model.set_latency(tps=20)

    with client.messages.stream(model=MODEL, max_tokens=100_000, messages=[user("/long 10000")]) as stream:
        next(iter(stream.text_stream))
    deadline = time.monotonic() + 2
    while model.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.02)

    stats = model.stats()
    assert stats["in_flight"] == 0
    assert stats["disconnects"] == 1


def test_client_hanging_up_during_ttft_ends_the_request(
    model: OfflineModel, client: anthropic.Anthropic
) -> None:
    model.set_latency(ttft_ms=30_000)

    with client.messages.stream(model=MODEL, max_tokens=1024, messages=[user("hi")]) as stream:
        next(iter(stream))  # message_start goes out before the TTFT wait
    deadline = time.monotonic() + 2
    while model.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.02)

    assert model.stats()["in_flight"] == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": 10, "messages": [user("hi")]}, "model: Field required"),
        ({"model": MODEL, "max_tokens": 10}, "messages: Field required"),
        ({"model": MODEL, "messages": [user("hi")]}, "max_tokens: Field required"),
        ({"model": MODEL, "max_tokens": 10, "messages": [{"role": "robot", "content": "hi"}]}, "messages.0"),
        ('{"model": "claude-offline", "max_tokens": 1', "not valid JSON"),
    ],
)
def test_malformed_requests_get_invalid_request_error(model: OfflineModel, body: Any, message: str) -> None:
    content = body if isinstance(body, str) else json.dumps(body)

    response = httpx.post(f"{model.base_url}/v1/messages", content=content, headers={"x-api-key": "test"})

    assert response.status_code == 400
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert message in response.json()["error"]["message"]


def test_bearer_token_is_accepted_and_a_missing_key_is_refused(model: OfflineModel) -> None:
    bearer = anthropic.Anthropic(base_url=model.base_url, auth_token="any-token", max_retries=0)
    body = {"model": MODEL, "max_tokens": 10, "messages": [user("hi")]}

    assert create(bearer, [user("hi")]).stop_reason == "end_turn"
    assert httpx.post(f"{model.base_url}/v1/messages", json=body).status_code == 401


def test_health_check_answers_ok(model: OfflineModel) -> None:
    assert httpx.get(f"{model.base_url}/healthz").json() == {"status": "ok"}


def test_command_line_server_answers_and_stops_cleanly_on_sigterm() -> None:
    """stop() raises unless the process printed its address and exited 0 on SIGTERM."""
    with start_offline_model(in_subprocess=True, ttft_ms=10) as model:
        client = anthropic.Anthropic(base_url=model.base_url, api_key="test", max_retries=0)
        assert create(client, [user("hi")]).content[0].text == "You said: hi"
        assert model.stats()["latency"]["ttft_ms"] == 10


def test_tokens_join_back_to_exactly_the_original_text() -> None:
    text = "  leading, inner\n\nnewlines and trailing  "

    assert "".join(split_tokens(text)) == text
    assert len(split_tokens("one two three")) == 3


def test_script_is_the_last_user_message_with_text_not_a_tool_result() -> None:
    messages = [
        user("first"),
        {"role": "user", "content": [{"type": "text", "text": "/bash ls"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
    ]

    assert find_script(messages) == (1, "/bash ls")


def test_script_directives_parse_and_bad_ones_explain_themselves() -> None:
    script = parse_script("/think a\n/sleep 999\n/long 3\n/bashful is text\n/tool t [1]\n/long many")

    assert script.thinking == "a"
    assert script.sleep_seconds == 60
    assert script.long_words == 3
    assert script.calls == ()
    assert len(script.errors) == 2
