"""A large completions prompt of token ids read compactly (gateway/api/token_ids.py): the
same call as the whole body's parse gives, the same bytes upstream, the same routing text;
and every body the fast path does not vouch for left to the ordinary parse."""

from __future__ import annotations

import orjson
import pytest

from gateway.api.calls import Endpoint, parse_call
from gateway.api.token_ids import LIFT_BYTES, SLICE_BYTES, lift_token_ids
from gateway.routing.inputs import TextPrompt
from gateway.routing.prompts import PromptHasher
from gateway.routing.sim_tokenizer import SimTokenizer
from gateway.routing.token_ids import TokenIds
from gateway.serving.calls import forwardable

IDS = [(n * 7919) % 128_256 for n in range(LIFT_BYTES // 3)]  # past LIFT_BYTES as JSON


def body(prompt: str, *, before: str = '"model": "m", ', after: str = ', "max_tokens": 4') -> bytes:
    """A completions body with ``prompt`` written as given (any JSON, any spacing)."""
    return ("{" + before + '"prompt": ' + prompt + after + "}").encode()


def ids_json(ids: list[int], sep: str = ", ") -> str:
    return "[" + sep.join(map(str, ids)) + "]"


@pytest.mark.parametrize("sep", [",", ", ", " ,\n\t", ",\r\n  "])
def test_a_large_prompt_of_token_ids_is_the_same_call_in_32_bit_words(sep: str) -> None:
    raw = body(ids_json(IDS, sep))
    lifted = lift_token_ids(raw)
    assert lifted is not None
    prompt = lifted["prompt"]
    assert isinstance(prompt, TokenIds) and prompt.ids.itemsize == 4
    whole = orjson.loads(raw)
    assert prompt == whole["prompt"] and len(prompt) == len(IDS) and prompt[5] == IDS[5]
    assert {k: v for k, v in lifted.items() if k != "prompt"} == {"model": "m", "max_tokens": 4}
    # The same Call (schema checked, prompt characters counted) as from the whole parse.
    call, expected = (
        parse_call(Endpoint.COMPLETIONS, lifted),
        parse_call(Endpoint.COMPLETIONS, whole),
    )
    assert call.prompt_chars == expected.prompt_chars == 4 * len(IDS)
    # Upstream: the same JSON, the ids as the client wrote them; routing: the same text.
    assert orjson.loads(forwardable(lifted)) == whole
    assert prompt.json.decode() in forwardable(lifted).decode()
    assert prompt.text() == " ".join(str(i) for i in IDS)
    for tokenizer in (None, SimTokenizer()):  # text mode, and token mode (the sim's)
        hasher = PromptHasher(model="m", block_size=16, tokenizer=tokenizer)
        routed = hasher.prompt(TextPrompt(prompt=prompt), "salt")
        listed = hasher.prompt(TextPrompt(prompt=IDS), "salt")
        assert routed == listed and len(routed.hashes) > 1000


def test_ids_are_read_in_slices_whatever_falls_on_a_slice_boundary() -> None:
    """Ids of every length, so that slice ends land on every digit of an id and its comma."""
    for width in range(1, 8):
        ids = [int("9" * width) - n % 3 for n in range(2 * SLICE_BYTES // (width + 1) + 17)]
        lifted = lift_token_ids(body(ids_json(ids, ","), after=" " * LIFT_BYTES))
        assert lifted is not None and lifted["prompt"] == ids


MALFORMED_OR_UNVOUCHED = {
    "trailing comma": body(ids_json(IDS)[:-1] + ",]"),
    "trailing comma past a slice": body("[" + "1," * (2 * SLICE_BYTES) + "]"),
    "leading comma": body("[," + ids_json(IDS)[1:]),
    "two commas": body(ids_json(IDS).replace(", ", ",, ", 1)),
    "empty array": body("[]", after=', "max_tokens": 4' + " " * LIFT_BYTES),
    "leading zero": body(ids_json([*IDS, 7]).replace(" 7]", " 07]")),
    "negative id": body(ids_json([*IDS, -1])),
    "id past 32 bits": body(ids_json([*IDS, 2**32])),
    "float": body(ids_json(IDS)[:-1] + ", 1.5]"),
    "strings": body('["' + '", "'.join(map(str, IDS)) + '"]'),
    "nested arrays": body("[" + ids_json(IDS) + "]"),
    "a later prompt wins": body(ids_json(IDS), after=', "prompt": "text"'),
    "a nested prompt first": body(
        ids_json(IDS), before='"model": "m", "extra": {"prompt": [1, 2]}, '
    ),
    "the stand-in in the body": body(
        ids_json(IDS), before='"model": "m", "suffix": "\\u0000kvgate:token-ids", '
    ),
    "a key ending in an escaped quote": body(
        ids_json(IDS), before='"model": "m", "x\\"prompt": [1], '
    ),
    "not JSON after the ids": body(ids_json(IDS), after=", }"),
    "small": body(ids_json(IDS[:100])),
}


@pytest.mark.parametrize("name", MALFORMED_OR_UNVOUCHED)
def test_a_body_the_fast_path_does_not_vouch_for_is_parsed_whole(name: str) -> None:
    raw = MALFORMED_OR_UNVOUCHED[name]
    assert name == "small" or len(raw) >= LIFT_BYTES
    assert lift_token_ids(raw) is None
