"""clean() and clean_tree() at the edges benchmarks/mutation.py found untested: the length
limit after cleaning, the smallest limits, and limits passed down into nested JSON values."""

from __future__ import annotations

from gputui.model.text import ELLIPSIS, clean, clean_tree


def test_a_value_at_the_limit_once_cleaned_is_not_cut() -> None:
    assert clean("\x07" + "x" * 10, limit=10) == "x" * 10


def test_a_limit_of_one_leaves_only_the_ellipsis() -> None:
    assert clean("abc", limit=1) == ELLIPSIS


def test_clean_tree_cuts_keys_and_nested_values_at_the_given_limit() -> None:
    assert clean_tree({"k" * 8: ["v" * 8, {"w" * 8: "u" * 8}], "n": "m" * 8}, limit=4) == {
        "kkk…": ["vvv…", {"www…": "uuu…"}], "n": "mmm…"}


def test_clean_tree_leaves_keys_that_are_not_strings() -> None:
    assert clean_tree({1: "a", None: "b"}) == {1: "a", None: "b"}
