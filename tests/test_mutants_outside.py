"""gputui.model.outside in process: the one parser of lines from outside (its bounds on length,
depth and integers, and the words of its refusals), the per-source Tally, and the numbers taken
from outside (finite, number_text, index), subclasses of int and float included. Written to kill
what benchmarks/mutation.py showed untested."""

from __future__ import annotations

import enum

import pytest

from gputui.model import outside
from gputui.model.outside import MAX_DEPTH, MAX_INT, Refused, Tally, finite, index, number_text, parse, parse_object


class Count(int):
    """An int subclass, as a library may hand one over (an IntEnum, a numpy-like scalar)."""


class Ratio(float):
    """A float subclass (numpy.float64 is one)."""


class Level(enum.IntEnum):
    LOW = 3


def refusal(text: str | bytes, **kwargs: int) -> str:
    with pytest.raises(Refused) as err:
        parse(text, **kwargs)
    return str(err.value)


# -- parse: integers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("-9223372036854775807", -(2**63) + 1),  # 20 characters, inside
    ("9223372036854775807", 2**63 - 1),  # 19
    ("123456789012345678", 123456789012345678),  # 18
])
def test_the_largest_integers_inside_63_bits_are_kept(text: str, value: int) -> None:
    assert outside.parse_counted(text) == (value, 0)


@pytest.mark.parametrize("text", ["9223372036854775808", "-9223372036854775808", "12345678901234567890",
                                  "-12345678901234567890", "1" * 400])
def test_integers_at_or_past_63_bits_are_none_and_counted(text: str) -> None:
    assert outside.parse_counted(text) == (None, 1)
    assert outside.parse_counted(f"[{text}, 1, {text}]") == ([None, 1, None], 2)


# -- parse: length, whitespace, refusals ------------------------------------------------------------------

def test_max_chars_bounds_the_line_in_every_parser() -> None:
    assert parse("[1, 2]", max_chars=6) == [1, 2]
    assert refusal("[1, 2]", max_chars=5) == "a line longer than 5 characters"
    with pytest.raises(Refused, match="^a line longer than 5 characters$"):
        parse_object('{"a": 1}', max_chars=5)
    tally = Tally("s")
    assert tally.line('{"a": 1}', max_chars=5) is None
    assert tally.warning() == "s sent a line longer than 5 characters; ignored (any more are counted, not shown)"
    assert tally.line('{"a": 1}', max_chars=8) == {"a": 1}


def test_only_jsons_own_whitespace_is_stripped() -> None:
    assert parse(" \t\r\n{}\n\r\t ") == {}
    assert refusal("\x0c{}").startswith("a line that is not JSON (")
    assert refusal("{}\u00a0") == "a line that is not JSON (text after the value)"


def test_each_refusal_says_why() -> None:
    assert refusal("{") == "a line that is not JSON (Expecting property name enclosed in double quotes)"
    assert refusal("") == "a line that is not JSON (Expecting value)"
    assert refusal("{} {}") == "a line that is not JSON (text after the value)"
    with pytest.raises(Refused) as err:
        parse_object("[1]")
    assert str(err.value) == "a line that is not a JSON object"


# -- parse: depth --------------------------------------------------------------------------------------

def test_lists_nested_to_the_limit_are_taken_one_deeper_refused() -> None:
    deepest = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    value = parse(deepest)
    for _ in range(MAX_DEPTH - 1):
        value = value[0]
    assert value == []
    assert refusal("[" + deepest + "]") == f"a line of JSON nested deeper than {MAX_DEPTH}"


def test_depth_is_what_is_measured_not_the_number_of_brackets() -> None:
    deepest = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert parse("[" + deepest[1:-1] + ", [], {}]")[1:] == [[], {}]  # 34 brackets, 32 deep
    assert refusal("[[" + deepest + "], []]") == f"a line of JSON nested deeper than {MAX_DEPTH}"


def test_objects_nested_one_past_the_limit_are_refused() -> None:
    assert isinstance(parse('{"a": ' * MAX_DEPTH + "1" + "}" * MAX_DEPTH), dict)
    assert refusal('{"a": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1)) == \
        f"a line of JSON nested deeper than {MAX_DEPTH}"


def test_many_shallow_containers_and_brackets_in_text_are_not_deep() -> None:
    assert parse("[" + ", ".join(["[]"] * 40) + "]") == [[]] * 40
    assert parse("[" + ", ".join(['{"a": {}}'] * 40) + "]") == [{"a": {}}] * 40
    assert parse('"' + "[{" * 40 + '"') == "[{" * 40


# -- parse: lone surrogates -------------------------------------------------------------------------------

def test_lone_surrogates_are_replaced_in_keys_lists_and_values() -> None:
    assert parse('{"k\\ud800": ["\\udc00x", 1, {"a": "\\uD83D"}]}') == {"k\ufffd": ["\ufffdx", 1, {"a": "\ufffd"}]}
    assert parse('["\\ud83d\\ude00"]') == ["\U0001f600"]  # a whole pair stays


# -- Tally --------------------------------------------------------------------------------------------

def test_a_fresh_tally_counts_nothing_and_has_nothing_to_say() -> None:
    tally = Tally("worker on slot a")
    assert (tally.refused, tally.nulled, tally.warning(), tally.summary()) == (0, 0, None, None)


def test_a_line_that_is_json_but_no_object_is_refused_and_said() -> None:
    tally = Tally("slave s1")
    assert tally.line("[1]") is None
    assert tally.warning() == "slave s1 sent a line that is not a JSON object; ignored (any more are counted, not shown)"
    assert tally.warning() is None
    assert tally.summary() == "slave s1: 1 line refused, 0 integers out of range"


def test_out_of_range_integers_add_up_and_the_first_is_said() -> None:
    tally = Tally("slave s1")
    assert tally.line('{"a": 99999999999999999999}') == {"a": None}
    assert tally.line('{"a": 99999999999999999999, "b": -99999999999999999999}') == {"a": None, "b": None}
    assert tally.nulled == 3
    assert tally.warning() == ("slave s1 sent an integer beyond +-2**63 (read as not known); ignored "
                               "(any more are counted, not shown)")
    assert tally.summary() == "slave s1: 0 lines refused, 3 integers out of range"
    assert tally.line("x") is None and tally.line("[]") is None
    assert tally.summary() == "slave s1: 2 lines refused, 3 integers out of range"


def test_the_summary_names_one_of_each_in_the_singular() -> None:
    tally = Tally("the events file")
    tally.line("x")
    tally.line('{"a": 99999999999999999999}')
    assert tally.summary() == "the events file: 1 line refused, 1 integer out of range"


# -- finite, number_text, index ----------------------------------------------------------------------------

def test_subclasses_of_float_and_int_are_numbers_when_finite_and_in_range() -> None:
    assert finite(Ratio(1.5)) == 1.5
    assert finite(Ratio("nan")) is None and finite(Ratio("inf")) is None and finite(Ratio("-inf")) is None
    assert finite(Count(MAX_INT - 1)) == MAX_INT - 1
    assert finite(Count(-MAX_INT + 1)) == -MAX_INT + 1
    assert finite(Count(MAX_INT)) is None and finite(Count(-MAX_INT)) is None
    assert finite(Level.LOW) == 3


@pytest.mark.parametrize("text, value", [
    ("0.812", 0.812), ("98", 98), (" -3 ", -3), ("+4", 4), ("1e-3", 0.001), (".5", 0.5), ("5.", 5.0),
    ("2E3", 2000.0), ("1" * 18, int("1" * 18)), (" " * 60 + "1234", 1234),
])
def test_decimal_text_is_a_number_an_int_when_written_as_one(text: str, value: float) -> None:
    got = number_text(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "0x10", "", " ", "1,5", "1e400", "1" * 20, "1.2.3", "e5",
                                  " " * 61 + "1234", "--1"])
def test_other_text_is_no_number(text: str) -> None:
    assert number_text(text) is None


def test_an_int_subclass_is_an_index_and_a_bool_is_not() -> None:
    assert index(Count(5)) == 5 and index(Level.LOW) == 3
    assert index(True) is None and index(Count(-1)) is None
