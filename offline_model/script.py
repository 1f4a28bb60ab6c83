"""What the offline model says next: a pure function of the conversation.

The script is the text of the last user message that carries text (tool results are not text).
Lines starting with a directive steer the model; everything else is echoed:

    /bash <command>      call tool ``bash`` with ``{"command": <command>}``
    /tool <name> <json>  call tool ``<name>`` with the JSON object as input (an MCP tool by the name the
                         harness offers it under, ``mcp__<server>__<tool>``)
    /think <text>        begin every answer to this script with a thinking block
    /long <N>            answer with N words (instead of the echo)
    /sleep <seconds>     wait that long before answering (at most 60 s)

Tool calls happen one per turn, in order; how many are done is counted from the assistant
``tool_use`` blocks after the script, so the same request always gets the same answer.
"""

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

MAX_SLEEP_SECONDS = 60.0
MAX_LONG_WORDS = 100_000
BASH_TOOL = "bash"

_DIRECTIVE = re.compile(r"^/(bash|tool|think|long|sleep)(?:\s+(.*))?$")
_PIECE = re.compile(r"\s*\S+|\s+")
_LONG_VOCABULARY = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


@dataclass(frozen=True)
class ToolCall:
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class Script:
    calls: tuple[ToolCall, ...] = ()
    thinking: str | None = None
    long_words: int | None = None
    sleep_seconds: float = 0.0
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Block:
    """One content block, already cut into the tokens it is streamed as."""

    type: Literal["text", "thinking", "tool_use"]
    pieces: tuple[str, ...]
    name: str = ""
    input: Mapping[str, Any] = field(default_factory=dict)

    @property
    def content(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True)
class Turn:
    blocks: tuple[Block, ...]
    stop_reason: Literal["end_turn", "tool_use", "max_tokens"]
    delay_seconds: float = 0.0

    @property
    def output_tokens(self) -> int:
        return sum(len(block.pieces) for block in self.blocks)


def split_tokens(text: str) -> tuple[str, ...]:
    """Cut text into word-sized tokens that join back to exactly the same text."""
    return tuple(_PIECE.findall(text))


def parse_script(text: str) -> Script:
    calls: list[ToolCall] = []
    thoughts: list[str] = []
    errors: list[str] = []
    long_words: int | None = None
    sleep_seconds = 0.0
    for line in text.splitlines():
        match = _DIRECTIVE.match(line.strip())
        if match is None:
            continue
        directive, argument = match.group(1), (match.group(2) or "").strip()
        if directive == "bash":
            if argument:
                calls.append(ToolCall(BASH_TOOL, {"command": argument}))
            else:
                errors.append("/bash needs a command, e.g. `/bash ls -la`.")
        elif directive == "tool":
            call_or_error = _parse_tool_line(argument)
            if isinstance(call_or_error, ToolCall):
                calls.append(call_or_error)
            else:
                errors.append(call_or_error)
        elif directive == "think":
            thoughts.append(argument)
        elif directive == "long":
            if argument.isdigit():
                long_words = min(int(argument), MAX_LONG_WORDS)
            else:
                errors.append(f"/long needs a whole number of words, got {argument!r}.")
        else:
            try:
                sleep_seconds = min(max(float(argument), 0.0), MAX_SLEEP_SECONDS)
            except ValueError:
                errors.append(f"/sleep needs a number of seconds, got {argument!r}.")
    return Script(
        calls=tuple(calls),
        thinking="\n".join(thoughts) if thoughts else None,
        long_words=long_words,
        sleep_seconds=sleep_seconds,
        errors=tuple(errors),
    )


def _parse_tool_line(argument: str) -> ToolCall | str:
    """A tool call, or the explanation the model answers with instead."""
    name, _, raw_input = argument.partition(" ")
    if not name:
        return '/tool needs a tool name and a JSON object, e.g. `/tool read_file {"path": "a.txt"}`.'
    try:
        tool_input = json.loads(raw_input or "{}")
    except json.JSONDecodeError as error:
        return f"Cannot call tool {name}: its input is not valid JSON ({error})."
    if not isinstance(tool_input, dict):
        return f"Cannot call tool {name}: its input must be a JSON object, got {raw_input.strip()}."
    return ToolCall(name, tool_input)


def find_script(messages: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
    """Position and text of the last user message with text; (-1, "") when there is none."""
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return position, content
        texts = [block.get("text", "") for block in _blocks(content) if block.get("type") == "text"]
        if texts:
            return position, "\n".join(texts)
    return -1, ""


def plan_turn(messages: Sequence[Mapping[str, Any]], *, max_tokens: int) -> Turn:
    """The next assistant turn for this conversation, cut to max_tokens."""
    position, text = find_script(messages)
    script = parse_script(text)
    since_script = messages[position + 1 :]
    blocks: list[Block] = []
    if script.thinking is not None:
        blocks.append(Block("thinking", split_tokens(script.thinking)))
    stop_reason: Literal["end_turn", "tool_use"] = "end_turn"
    calls_done = sum(1 for block in _assistant_blocks(since_script) if block.get("type") == "tool_use")
    if script.errors:
        blocks.append(_text("\n".join(script.errors)))
    elif calls_done < len(script.calls):
        call = script.calls[calls_done]
        blocks.append(_text(f"Calling {call.name}."))
        blocks.append(Block("tool_use", split_tokens(json.dumps(call.input)), call.name, call.input))
        stop_reason = "tool_use"
    elif script.calls:
        blocks.append(_text(quote_tool_results(since_script)))
    elif script.long_words is not None:
        blocks.append(_text(long_text(script.long_words)))
    else:
        blocks.append(_text(f"You said: {text}"))
    return truncate(Turn(tuple(blocks), stop_reason, script.sleep_seconds), max_tokens=max_tokens)


def truncate(turn: Turn, *, max_tokens: int) -> Turn:
    """Keep the first max_tokens tokens; a tool call that does not fit is dropped whole.

    Dropping rather than cutting a tool call keeps every tool_use input valid JSON, which is
    what a client can rely on when stop_reason is "tool_use" and nothing more.
    """
    if turn.output_tokens <= max_tokens:
        return turn
    budget = max_tokens
    kept: list[Block] = []
    for block in turn.blocks:
        if len(block.pieces) <= budget:
            kept.append(block)
            budget -= len(block.pieces)
            continue
        if block.type != "tool_use" and budget > 0:
            kept.append(Block(block.type, block.pieces[:budget], block.name, block.input))
        break
    return Turn(tuple(kept), "max_tokens", turn.delay_seconds)


def quote_tool_results(messages: Sequence[Mapping[str, Any]]) -> str:
    names = {
        block.get("id"): block.get("name", "tool")
        for block in _assistant_blocks(messages)
        if block.get("type") == "tool_use"
    }
    lines = []
    for message in messages:
        if message.get("role") != "user":
            continue
        for block in _blocks(message.get("content")):
            if block.get("type") != "tool_result":
                continue
            name = names.get(block.get("tool_use_id"), "tool")
            label = f"Error from {name}" if block.get("is_error") else f"Result of {name}"
            lines.append(f"{label}: {_result_text(block.get('content'))}")
    return "\n".join(lines) or "No tool results came back."


def long_text(words: int) -> str:
    return " ".join(_LONG_VOCABULARY[i % len(_LONG_VOCABULARY)] for i in range(words))


def count_input_tokens(request: Mapping[str, Any]) -> int:
    """Words in the prompt: an approximation that moves the way real token counts do."""
    return sum(
        len(text.split()) for key in ("system", "messages", "tools") for text in _strings(request.get(key))
    )


def _text(text: str) -> Block:
    return Block("text", split_tokens(text))


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        block.get("text", "") if block.get("type") == "text" else f"[{block.get('type')}]"
        for block in _blocks(content)
    )


def _blocks(content: Any) -> list[Mapping[str, Any]]:
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, Mapping)]


def _assistant_blocks(messages: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    for message in messages:
        if message.get("role") == "assistant":
            yield from _blocks(message.get("content"))


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
