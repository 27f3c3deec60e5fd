"""An input serializer judges each body on its own, refuses unknown fields and wrong JSON types,
and refuses a whole body that is not an object (`StrictInput`)."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from backend.api.errors import RequestBodyNotAnObject
from backend.api.executor_serializers import ProgressInput, ResultInput
from backend.api.serializers import MessageInput, StrictInput, TextField

GOOD = {
    "worker_id": "w",
    "attempt": 2,
    "status": "COMPLETED",
    "result": {"value": "Done."},
    "usage": {"input_tokens": 10, "output_tokens": 3},
}


def _judged(body: dict) -> tuple[bool, dict]:
    payload = ResultInput(data=body)
    valid = payload.is_valid()
    return valid, dict(payload.validated_data) if valid else payload.errors


def test_each_body_is_judged_on_its_own():
    bodies = [
        {**GOOD, "usage": {"input_tokens": -1, "extra": 1}},
        GOOD,
        {**GOOD, "attempt": "2", "status": "DONE"},
        {**GOOD, "usage": None, "error_code": "Bad Code"},
        {key: value for key, value in GOOD.items() if key != "worker_id"},
        GOOD,
    ]
    judged = [_judged(body) for body in bodies]
    assert judged[1] == judged[5]
    assert judged[1][0] and judged[1][1]["usage"] == {"input_tokens": 10, "output_tokens": 3}
    assert judged[1][1]["attempt"] == 2 and judged[1][1]["error"] == ""
    assert judged[0] == (False, {"usage": {"extra": ["Unknown field."]}})
    assert judged[2] == (
        False,
        {"attempt": ["Must be an integer."]},  # types are checked before values
    )
    assert judged[3] == (
        False,
        {"error_code": ["Use a lowercase code such as upstream_error."]},
    )
    assert judged[4] == (False, {"worker_id": ["This field is required."]})
    # Every error list is of its own body: a later body's validation leaves it as it was.
    assert _judged(bodies[0]) == judged[0]


def test_only_the_whole_body_must_be_an_object():
    assert ResultInput(data=GOOD).is_valid()
    valid, errors = _judged({**GOOD, "usage": [1]})
    assert not valid and set(errors) == {"usage"}
    with pytest.raises(RequestBodyNotAnObject):
        ResultInput(data=[GOOD]).is_valid()


@pytest.mark.parametrize(
    ("text", "errors"),
    [
        ("plain", None),
        ("", None),
        ("astral 🦀 and CJK 漢字 are whole code points", None),
        ("\ufffd a replacement character is text", None),
        ("a lone \ud800 high surrogate", ["Surrogate characters are not allowed: U+D800."]),
        ("first \udfff then \ud801", ["Surrogate characters are not allowed: U+DFFF."]),
        ("x" * 100_000 + "\udc00", ["Surrogate characters are not allowed: U+DC00."]),
    ],
)
def test_a_text_field_refuses_lone_surrogates_as_drf_does(text, errors):
    """`TextField` answers what DRF's CharField answers, naming the first lone surrogate."""
    body = {"text": text}
    mine = _Text(data=body)
    drf = _DrfText(data=body)
    assert mine.is_valid() is drf.is_valid() is (errors is None)
    if errors is not None:
        assert mine.errors == drf.errors == {"text": errors}
        assert mine.errors["text"][0].code == "surrogate_characters_not_allowed"


class _Text(StrictInput):
    text = TextField(allow_blank=True, trim_whitespace=False)


class _DrfText(StrictInput):
    text = serializers.CharField(allow_blank=True, trim_whitespace=False)


@pytest.mark.parametrize("text", ["a lone \ud800 high surrogate", "a NUL \x00", "plain"])
def test_an_executors_partial_answer_takes_what_an_agent_may_stream(text):
    """A partial answer is an executor's text, as a result is: NUL and lone surrogates are
    taken (the service stores them as U+FFFD), where a product's message refuses them."""
    progress = ProgressInput(data={"worker_id": "w", "attempt": 1, "partial_text": text})
    assert progress.is_valid(), progress.errors
    assert progress.validated_data["partial_text"] == text
    assert MessageInput(data={"message": text}).is_valid() is (text == "plain")
