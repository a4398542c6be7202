"""Rule scorers on hand-written responses."""

import pytest

from rljax.rewards import arithmetic
from rljax.rewards import default_compute_score
from rljax.rewards import gsm8k
from rljax.rewards import math_answer

GSM8K = "openai/gsm8k"
MATH = "lighteval/MATH"
ARITH = "rljax/arithmetic"

# (data_source, response, ground_truth, expected score)
CASES = [
    # gsm8k, strict "#### N" (verl's default method).
    (GSM8K, "She has 3 + 4 = 7 apples.\n#### 7", "7", 1.0),
    (GSM8K, "#### 8", "7", 0.0),
    (GSM8K, "The answer is 7.", "7", 0.0),  # no "####": strict fails
    (GSM8K, "#### 1,200", "1200", 1.0),
    (GSM8K, "#### 5\nwait, recompute\n#### 6", "6", 1.0),  # last one counts
    (GSM8K, "#### 5\nwait, recompute\n#### 6", "5", 0.0),
    (GSM8K, "#### -3", "-3", 1.0),
    (GSM8K, "#### 42.", "42", 0.0),  # verl keeps the trailing "."
    (GSM8K, "####7", "7", 0.0),  # malformed: no space
    (GSM8K, "", "7", 0.0),
    (GSM8K, "x" * 400 + "#### 9", "9", 1.0),  # long response, answer at end
    (GSM8K, "#### 9" + " filler" * 60, "9", 0.0),  # answer clipped away
    # math, last \boxed{}.
    (MATH, r"So $x = \boxed{5}$.", "5", 1.0),
    (MATH, r"\boxed{3} no wait \boxed{4}", "4", 1.0),
    (MATH, r"\boxed{3} no wait \boxed{4}", "3", 0.0),
    (MATH, r"The answer is \boxed{\frac{1}{2}}.", r"\frac{1}{2}", 1.0),
    (MATH, r"\boxed{\dfrac{1}{2}}", r"\frac12", 1.0),
    (MATH, r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (MATH, r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", 1.0),
    (MATH, r"\boxed{ \left( 1, 2 \right) }", "(1,2)", 1.0),
    (MATH, r"\boxed{\{1, 2\}}", r"\{1,2\}", 1.0),
    (MATH, r"\boxed{90^\circ}", "90", 1.0),
    (MATH, r"\boxed{x = 3}", "3", 1.0),
    (MATH, r"\boxed{10\%}", "10", 1.0),
    (MATH, r"\boxed{3/4}", r"\frac{3}{4}", 1.0),
    (MATH, r"\boxed 7$", "7", 1.0),
    (MATH, r"\fbox{12}", "12", 0.0),  # verl finds \fbox but cannot unwrap it
    (MATH, r"\boxed{\frac{1}{2}", r"\frac{1}{2}", 0.0),  # unclosed brace
    (MATH, "The answer is 5.", "5", 0.0),  # no box
    (MATH, r"\boxed{6}", "5", 0.0),
    # the synthetic task: last number in the response.
    (ARITH, "7", "7", 1.0),
    (ARITH, "3 + 4 = 7", "7", 1.0),
    (ARITH, "The answer is 7.", "7", 1.0),
    (ARITH, "7.0", "7", 1.0),
    (ARITH, "1,000", "1000", 1.0),
    (ARITH, "It is 7, not 8.", "7", 0.0),  # several numbers: the last wins
    (ARITH, "-2", "-2", 1.0),
    (ARITH, "5 - 7 = -2", "-2", 1.0),
    (ARITH, "seven", "7", 0.0),
    (ARITH, "", "7", 0.0),
    (ARITH, "17", "7", 0.0),
]


@pytest.mark.parametrize("source,response,truth,expected", CASES)
def test_default_compute_score(source, response, truth, expected):
  assert default_compute_score(source, response, truth) == expected


def test_table_is_large_and_mixed():
  assert len(CASES) >= 20
  assert {c[3] for c in CASES} == {0.0, 1.0}


def test_gsm8k_flexible_and_format_score():
  # verl's flexible answer is the last run of digits, "." and "," as it is.
  assert gsm8k.extract_solution("So 3 + 4 = 7.", "flexible") == "7."
  assert gsm8k.extract_solution("no digits here", "flexible") is None
  assert gsm8k.extract_solution("x = 5 ...", "flexible") == "..."
  assert gsm8k.extract_solution("x = 5 .", "flexible") == "5"
  assert gsm8k.extract_solution(". .", "flexible") == "."
  assert gsm8k.compute_score("So it is 7", "7", method="flexible") == 1.0
  # verl 0.9.1's default_compute_score takes other keywords and passes none on: gsm8k scores strictly there
  assert default_compute_score(GSM8K, "So it is 7", "7", method="flexible") == 0.0
  assert gsm8k.compute_score("#### 8", "7", format_score=0.1) == 0.1
  assert gsm8k.compute_score("no answer", "7", format_score=0.1) == 0.0


def test_arithmetic_format_score():
  assert arithmetic.compute_score("8", "7", format_score=0.1) == 0.1
  assert arithmetic.compute_score("none", "7", format_score=0.1) == 0.0


def test_last_boxed_nested_braces():
  text = r"first \boxed{1} then \boxed{\frac{a^{2}}{\sqrt{b_{1}}}} done"
  assert math_answer.last_boxed(text) == r"\frac{a^{2}}{\sqrt{b_{1}}}"
  assert math_answer.last_boxed("no box") is None


def test_unknown_data_source_names_known_ones():
  with pytest.raises(NotImplementedError, match="openai/gsm8k"):
    default_compute_score("someone/else", "1", "1")
