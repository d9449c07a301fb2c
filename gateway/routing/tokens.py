"""A request's prompt tokens exactly as a vLLM replica computes them, from the model's
own tokenizer directory, without importing vllm or transformers.

What vLLM 0.32 does with a Hugging Face tokenizer, and what is reproduced here:

- chat: messages are normalised (string content as is; a list of text parts joined with
  newlines when the template reads ``content`` as a string, kept as
  ``[{"type": "text", ...}]`` parts when it loops over them; tool-call arguments parsed
  from JSON), rendered with the chat template in transformers' sandboxed Jinja
  environment (``trim_blocks``, ``lstrip_blocks``, loop controls, its ``tojson``,
  ``raise_exception`` and ``strftime_now``; the named special tokens as variables), and
  the text tokenized WITHOUT special tokens (the template writes them);
- completions: a string prompt is tokenized WITH special tokens (BOS, by the tokenizer's
  post-processor); a list of token ids is taken as is.

`ChatTokenizer` is a `gateway.routing.inputs.PromptTokenizer`: the app loads it once per
deployment (tens of milliseconds) and hands it to the fleet; encoding is the `tokenizers`
Rust library, well under a millisecond for ordinary prompts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from gateway.routing.inputs import ChatPrompt, TextPrompt
from gateway.routing.token_ids import TokenIds

SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)  # fmt: skip


class TokenizerError(ValueError):
    """A tokenizer directory or a chat that cannot be turned into tokens."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' own filter: Jinja's escapes HTML, which would change the prompt.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTokenizer:
    """A model's tokenizer and chat template, loaded once from its directory."""

    def __init__(
        self, tokenizer: Tokenizer, chat_template: str | None, special_tokens: Mapping[str, str]
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens)
        self._env = _environment()
        self._template = None if chat_template is None else self._env.from_string(chat_template)
        self.content_format = (
            "string" if chat_template is None else content_format(chat_template, self._env)
        )

    @classmethod
    def load(cls, directory: Path | str) -> ChatTokenizer:
        """From a Hugging Face model directory: tokenizer.json and tokenizer_config.json."""
        path = Path(directory)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(f"{path}: no tokenizer.json (only fast tokenizers are supported)")
        config = _read_json(path / "tokenizer_config.json")
        tokens = {}
        for name in SPECIAL_TOKEN_NAMES:
            value = config.get(name)
            if isinstance(value, Mapping):  # an AddedToken written out in full
                value = value.get("content")
            if isinstance(value, str):
                tokens[name] = value
        return cls(Tokenizer.from_file(str(tokenizer_file)), _chat_template(path, config), tokens)

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of ``text``."""
        # The batch call without character offsets: the same ids, a third less time.
        batch = self.tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return list(batch[0].ids)

    def render(self, chat: ChatPrompt) -> str:
        """A chat's prompt text, as vLLM renders it."""
        if self._template is None:
            raise TokenizerError("the tokenizer has no chat template")
        messages = [self._message(m) for m in chat.messages]
        kwargs: dict[str, Any] = dict(self.special_tokens)
        if isinstance(chat.template_kwargs, Mapping):
            kwargs.update(chat.template_kwargs)
        continue_final = chat.continue_final_message
        add_generation_prompt = chat.add_generation_prompt and not continue_final
        tag = "CONTINUE_FINAL_MESSAGE_TAG "
        if continue_final and messages and isinstance(messages[-1].get("content"), str):
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + tag}
        try:
            text = self._template.render(
                messages=messages,
                tools=chat.tools,
                documents=chat.documents,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"the chat template refused the chat: {exc}") from exc
        if continue_final and tag.strip() in text:
            # As transformers does: cut the chat right after the final message's text.
            at = text.rindex(tag.strip())
            text = text[:at] if text[at : at + len(tag)] == tag else text[:at].rstrip()
        return text

    def chat_tokens(self, chat: ChatPrompt) -> list[int]:
        """A chat's prompt token ids."""
        return self.encode(self.render(chat), add_special_tokens=chat.add_special_tokens)

    def completion_tokens(self, prompt: TextPrompt) -> Sequence[int]:
        """A completions prompt's token ids (the first prompt of a batch)."""
        text = prompt.prompt
        add_special = prompt.add_special_tokens
        if isinstance(text, str):
            return self.encode(text, add_special_tokens=add_special)
        if isinstance(text, TokenIds):
            return text.ids  # 32-bit words: no int object per id
        if isinstance(text, Sequence) and text:
            first = text[0]
            if isinstance(first, int):
                return [int(t) for t in text]
            if isinstance(first, str):
                return self.encode(first, add_special_tokens=add_special)
            if isinstance(first, list):
                return [int(t) for t in first]
        raise TokenizerError("'prompt' must be a string, token ids, or a list of them")

    def _message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """One message as vLLM hands it to the template: role, content and known fields."""
        role = message["role"]
        content = message.get("content")
        if content is None:
            texts: list[str] = []
        elif isinstance(content, str):
            texts = [content]
        else:
            texts = [str(p.get("text", "")) for p in content if isinstance(p, Mapping)]
        out: dict[str, Any] = {"role": role}
        if self.content_format == "string" or role == "tool":
            out["content"] = "\n".join(texts)
        else:
            out["content"] = [{"type": "text", "text": t} for t in texts]
        if role == "assistant":
            tool_calls = message.get("tool_calls")
            if isinstance(tool_calls, list) and tool_calls:
                out["tool_calls"] = [_parsed_arguments(c) for c in tool_calls]
            reasoning = message.get("reasoning")
            if reasoning is not None:
                out["reasoning"] = out["reasoning_content"] = reasoning
        elif role == "tool" and "tool_call_id" in message:
            out["tool_call_id"] = message["tool_call_id"]
        for key in ("name", "task"):
            if isinstance(message.get(key), str):
                out[key] = message[key]
        return out


def _parsed_arguments(call: Any) -> Any:
    """vLLM hands templates tool-call arguments as objects, not JSON strings."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = call["function"]
    arguments = function.get("arguments")
    if not arguments:
        parsed: Any = {}
    elif isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            parsed = {}  # vLLM's choice: a malformed history must not fail every later turn
    else:
        parsed = arguments
    return {**call, "function": {**function, "arguments": parsed}}


def content_format(template: str, env: jinja2.Environment | None = None) -> str:
    """``openai`` when the template loops over a message's content parts, else ``string``.

    vLLM's detection, reduced to its common case: a ``for`` over ``x.content`` or
    ``x['content']`` (or a variable named ``content``) where ``x`` iterates ``messages``.
    """
    ast = (env or _environment()).parse(template)
    message_names: set[str] = set()
    for loop in ast.find_all(jinja2.nodes.For):
        if _names(loop.iter) == ("messages",) and isinstance(loop.target, jinja2.nodes.Name):
            message_names.add(loop.target.name)
    for loop in ast.find_all(jinja2.nodes.For):
        names = _names(loop.iter)
        if names == ("content",) or (
            len(names) == 2 and names[0] in message_names and names[1] == "content"
        ):
            return "openai"
    return "string"


def _names(node: jinja2.nodes.Node) -> tuple[str, ...]:
    """``messages`` → ("messages",); ``m.content`` / ``m['content']`` → ("m", "content")."""
    while isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test)) and node.node is not None:
        node = node.node
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        node = node.node
    if isinstance(node, jinja2.nodes.Name):
        return (node.name,)
    if isinstance(node, jinja2.nodes.Getattr) and isinstance(node.node, jinja2.nodes.Name):
        return (node.node.name, node.attr)
    if (
        isinstance(node, jinja2.nodes.Getitem)
        and isinstance(node.node, jinja2.nodes.Name)
        and isinstance(node.arg, jinja2.nodes.Const)
        and isinstance(node.arg.value, str)
    ):
        return (node.node.name, node.arg.value)
    return ()


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else {}


def _chat_template(path: Path, config: Mapping[str, Any]) -> str | None:
    """The default chat template: chat_template.jinja, chat_template.json, or the config's."""
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = _read_json(path / "chat_template.json").get("chat_template")
    if template is None:
        template = config.get("chat_template")
    if isinstance(template, list):  # named templates: vLLM uses the one called "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None
