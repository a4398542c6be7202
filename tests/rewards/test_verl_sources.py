"""verl's data sources in `default_compute_score`, scored as verl scores them.

Every expected value below is the result of verl's own scorer
(`verl/utils/reward_score`, volcengine/verl at b178a3c, run with sympy,
pylatexenc and mathruler installed) on the same input, and was scored again
with verl 0.9.1's (its PyPI wheel, 2026-12-07): the same value on every case
(math_dapo's cases already hold 0.9.1's boxed-answer fallback; the
pathological inputs are rljax's own bounds: verl evaluates
pi times 9**9**9**9 without a time limit). verl's repository has
no unit tests of these scorers (its tests/utils/reward_score covers the code
sandbox only), so the cases are written here, one table per scorer.
"""

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rljax import rewards
from rljax.rewards import default
from rljax.rewards import expr_equal
from rljax.rewards import geo3k
from rljax.rewards import latex_text
from rljax.rewards import math_dapo
from rljax.rewards import prime_math
from rljax.utils import safe_arith
from rljax.rewards import search_r1
from rljax.rewards.default import default_compute_score

# Every data_source verl's default_compute_score scores without a sandbox
# ("aime" stands for any name starting with it).
VERL_SOURCES = [
    "openai/gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500", "math_dapo", "math", "math_dapo_reasoning",
    "aime2024", "aime_2025", "aime", "numina_aops_forum",
    "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
    "numina_cn_k12", "numina_olympiads", "hiyouga/geometry3k", "searchR1_nq",
    "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
    "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle",
]
CODE_SOURCES = ["codecontests", "apps", "codeforces", "taco"]

MATH = "lighteval/MATH"
# (data_source, response, ground truth, verl's score): verl's math_reward.
MATH_CASES = [
    (MATH, r"\boxed{ 1,000 }", "1000", 0.0),  # no thousands separators
    (MATH, r"\boxed{ 1,000 }", "1,000", 1.0),
    (MATH, r"\fbox{7}", "7", 0.0),  # found, but only \boxed is unwrapped
    (MATH, r"\boxed{7}", r"\boxed{7}", 0.0),  # the truth is not unboxed
    (MATH, r"\boxed 7$ and later \boxed{8}", "7", 1.0),  # "\boxed " wins
    (MATH, r"\boxed{\text{(B)}}", r"\text{(B)}", 1.0),
    (MATH, r"\boxed{\text{B}}", "B", 0.0),  # \text{} is not removed
    (MATH, r"\boxed{5\text{ cm}}", "5", 1.0),  # a units suffix is
    (MATH, r"\boxed{5\text{ cm}\text{ m}}", "5", 0.0),  # two: raw compare
    (MATH, r"\boxed{2.50}", "2.5", 0.0),  # no numeric comparison
    (MATH, r"\boxed{.5}", r"\frac12", 1.0),
    (MATH, r"\boxed{k = 7}", "7", 1.0),
    (MATH, r"\boxed{abc = 7}", "7", 0.0),  # only a short "x =" goes
    (MATH, r"\boxed{\sqrt}", r"\sqrt", 1.0),  # normalising fails: raw equal
    (MATH, r"\boxed{\dfrac{3}{4}}", "3/4", 1.0),
    (MATH, r"\boxed{-\frac{1}{2}}", r"-\frac12", 1.0),
    (MATH, r"\boxed{1/2}", "0.5", 1.0),
    (MATH, r"\boxed{\$5}", "5", 1.0),
    ("DigitalLearningGmbH/MATH-lighteval", r"$\boxed{12}$", "12", 1.0),
    ("HuggingFaceH4/MATH-500", r"\boxed{\left[ 1, 2 \right)}", "[1,2)", 1.0),
]

# (data_source, response, ground truth, verl's {"score", "acc", "pred"}).
DAPO_CASES = [
    ("math_dapo", "Answer: 12", "12", (1.0, True, "12")),
    ("math_dapo", "answer : 12\n", "12", (1.0, True, "12")),
    ("math_dapo", "Answer: $12$", "12", (1.0, True, "12")),
    # no `Answer:` line: the last box in the last 100 characters, verbatim (verl 0.9.1's fallback)
    ("math_dapo", r"So \boxed{12}", "12", (1.0, True, "12")),
    ("math_dapo", r"\boxed{ 12}", "12", (-1.0, False, " 12")),
    ("math_dapo", r"\boxed{\frac{1}{2}}", r"\frac12", (-1.0, False, r"\frac{1}{2}")),
    ("math_dapo", r"\boxed{12}" + "x" * 100, "12", (-1.0, False, "[INVALID]")),
    ("math_dapo", r"\boxed{12", "12", (-1.0, False, "[INVALID]")),
    ("math_dapo", r"\boxed{13} Answer: 12", "12", (1.0, True, "12")),  # an `Answer:` line wins
    ("math_dapo", "Answer: 1,000", "1000", (1.0, True, "1000")),
    ("math_dapo", "Answer: 5 dollars", "5", (1.0, True, "5")),
    ("math_dapo", "Answer: x = 5", "5", (1.0, True, "5")),
    ("math_dapo", r"Answer: \frac12", r"\frac{1}{2}",
     (1.0, True, r"\frac{1}{2}")),
    ("math_dapo", "Answer: 0.5", r"\frac{1}{2}", (-1.0, False, "0.5")),
    ("math_dapo", "Answer: 3\nAnswer: 4", "4", (1.0, True, "4")),
    ("math_dapo", "Answer: 12\n" + "x" * 300, "12",
     (-1.0, False, "[INVALID]")),  # only the last 300 characters are read
    ("math_dapo", r"Answer: \text{(B)}", "(B)", (1.0, True, "(B)")),
    ("math_dapo", r"Answer: 90^\circ", "90", (1.0, True, "90")),
    ("math_dapo", "Answer: 13", "12", (-1.0, False, "13")),
    ("math", "Answer: 7", "7", (1.0, True, "7")),
    ("math_dapo_reasoning", "Answer: 7", "7", (1.0, True, "7")),
    ("aime2024", "Answer: 204", "204", (1.0, True, "204")),
    ("aime_2025", "Answer: 204", "205", (-1.0, False, "204")),
    ("aime2024", r"So we get \boxed{204}", "204", (1.0, True, "204")),
]

# (data_source, response, ground truth, verl's score): verl's prime_math.
NUMINA_CASES = [
    ("numina_olympiads", "The answer is 5.", "5", 1.0),
    ("numina_olympiads", r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    ("numina_cn_k12", r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
    ("numina_cn_k12", r"\boxed{1,000}", "1000", 1.0),
    ("numina_cn_k12", r"\boxed{50\%}", "0.5", 1.0),  # percentages
    ("numina_cn_k12", r"\boxed{50\%}", "50", 1.0),
    ("numina_aops_forum", r"\fbox{7}", "7", 1.0),
    ("numina_aops_forum", r"\boxed{(1, 2)}", "(1,2)", 1.0),
    ("numina_aops_forum", r"\boxed{(2, 1)}", "(1,2)", 0.0),
    ("numina_synthetic_math", r"\boxed{\text{B}}", "B", 1.0),
    ("numina_synthetic_math", r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("numina_synthetic_math", r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", 0.0),
    ("numina_synthetic_amc", "so x = 6", "5", 0.0),
    ("numina_synthetic_amc", r"\boxed{\frac{\pi}{2}}", "1.5708", 0.0),
    ("numina_synthetic_amc", "The answer is Point(1, 2)", "(1, 2)", 0.0),
    ("numina_amc_aime", r"\boxed{[5]}", r"\begin{pmatrix}5\end{pmatrix}", 1.0),
    ("numina_amc_aime", "The answer is Matrix([[1],[2]])",
     r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", 1.0),
    ("numina_amc_aime", "The answer is 3/10.", "0.1+0.2", 1.0),
    ("numina_amc_aime", r"\boxed{0.3}", "3/10", 1.0),
    ("numina_amc_aime", r"\boxed{0.1+0.2}", "3/10", 0.0),
    ("numina_olympiads", "The answer is Interval.Ropen(-1, 3)", "[-1, 3)",
     1.0),
    ("numina_olympiads", r"\boxed{1011_2}", "1011", 1.0),
    ("numina_olympiads", r"\boxed{\$5}", "5", 1.0),
    ("numina_olympiads", r"\boxed{6.28}", r"2\pi", 1.0),  # pi as 3.14
    ("numina_olympiads", r"\boxed{5 \text{ cm}}", "5", 1.0),
    ("numina_olympiads", r"\boxed{3\frac{1}{2}}", "3.5", 1.0),
    ("numina_olympiads", r"\boxed{x(x+1)}", "x^2+x", 1.0),
    ("numina_olympiads", r"\boxed{\sqrt{x^2}}", "x", 0.0),
    ("numina_olympiads", "The answer is __import__('os').getpid()", "0", 0.0),
    ("numina_olympiads", "no number here", "5", 0.0),
]

GEO = "hiyouga/geometry3k"
# (data_source, response, ground truth, verl's score): verl's geo3k.
GEO_CASES = [
    (GEO, r"<think>r</think> \boxed{2\sqrt{3}}", r"\sqrt{12}", 1.0),
    (GEO, r"\boxed{2\sqrt{3}}", r"\sqrt{12}", 0.9),  # no <think> format
    (GEO, r"<think>r</think> \boxed{3}", "4", 0.1),  # format only
    (GEO, "<think>r</think> 4", "4", 0.0),
    (GEO, r"<think>x</think>\boxed{50%}", "50", 1.0),
    (GEO, r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", 0.0),
    (GEO, r"\boxed{ 1,000 }", "1000", 0.9),
    (GEO, r"\boxed{\frac{1}{2}}", "0.5", 0.9),
    (GEO, "<think>a</think>\n\\boxed{None}", "None", 1.0),
]

# (data_source, response, ground truth, verl's score): verl's
# search_r1_like_qa_em.
SEARCH_CASES = [
    ("searchR1_nq", "<answer>The Beatles</answer>",
     {"target": ["the beatles"]}, 1.0),
    ("searchR1_triviaqa", "<answer> beatles! </answer>",
     {"target": ["The Beatles"]}, 1.0),
    ("searchR1_popqa", "<answer>Beatles</answer>", {"target": "Beatles"}, 1.0),
    ("searchR1_hotpotqa", "Paris", {"target": ["paris"]}, 0.0),
    ("searchR1_2wikimultihopqa",
     "<answer>x</answer> then <answer>Paris</answer>",
     {"target": ["paris"]}, 1.0),
    ("searchR1_musique", "<answer>London</answer>",
     {"target": ["paris", "rome"]}, 0.0),
    ("searchR1_bamboogle", "<answer>Paris</answer>" * 11,
     {"target": ["paris"]}, 0.25),  # more than 10 tags: a quarter
    ("searchR1_nq", "<answer>New\nYork</answer>",
     {"target": np.array(["new york", "nyc"])}, 1.0),
]

GSM8K_CASES = [
    ("openai/gsm8k", "#### 1,200", "1200", 1.0),
    ("openai/gsm8k", "#### 42.", "42", 0.0),
    ("openai/gsm8k", "#### $5", "5", 0.0),
]


@pytest.mark.parametrize(
    "source,response,truth,expected",
    MATH_CASES + NUMINA_CASES + GEO_CASES + SEARCH_CASES + GSM8K_CASES)
def test_scores_equal_verls(source, response, truth, expected):
  assert default_compute_score(source, response, truth) == expected


@pytest.mark.parametrize("source,response,truth,expected", DAPO_CASES)
def test_math_dapo_scores_equal_verls(source, response, truth, expected):
  score, acc, pred = expected
  assert default_compute_score(source, response, truth) == {
      "score": score, "acc": acc, "pred": pred}


def test_every_table_has_right_and_wrong_answers():
  for table in (MATH_CASES, NUMINA_CASES, GEO_CASES, SEARCH_CASES):
    scores = {case[3] for case in table}
    assert 0.0 in scores and 1.0 in scores
  assert {case[3][1] for case in DAPO_CASES} == {True, False}


def test_math_dapo_strict_box_verify():
  text = "Some work. " * 20 + r"so \boxed{12}"
  assert math_dapo.compute_score(text, "12", strict_box_verify=True) == {
      "score": 1.0, "acc": True, "pred": "12"}
  spaced = math_dapo.compute_score(r"\boxed{ 12 }", "12",
                                   strict_box_verify=True)
  assert spaced == {"score": -1.0, "acc": False, "pred": " 12 "}
  assert math_dapo.compute_score("Answer: 12", "12", True)["pred"] is None


def test_every_verl_source_has_a_scorer():
  for source in VERL_SOURCES:
    assert default.has_builtin_scorer(source), source
  assert "aime*" in rewards.known_data_sources()
  assert not default.has_builtin_scorer("someone/else")
  assert not default.has_builtin_scorer(None)


@pytest.mark.parametrize("source", CODE_SOURCES)
def test_code_sources_name_the_custom_function_and_never_run(source, tmp_path):
  marker = tmp_path / "ran"
  code = f"open({str(marker)!r}, 'w').write('x')"
  with pytest.raises(NotImplementedError) as info:
    default_compute_score(source, code, '{"inputs": [], "outputs": []}')
  assert "custom_reward_function.path" in str(info.value)
  assert "reward_model.sandbox_fusion.url" in str(info.value)
  assert not marker.exists()
  assert source not in rewards.known_data_sources()


def test_check_data_sources_stops_on_a_code_source(tmp_path):
  path = tmp_path / "train.parquet"
  pq.write_table(pa.table({"data_source": ["aime2024", "apps"]}), path)
  with pytest.raises(ValueError, match="row 1: data_source 'apps' is a code task") as info:
    rewards.check_data_sources([str(path)])
  assert "custom_reward_function.path" in str(info.value)
  assert "reward_model.sandbox_fusion.url" in str(info.value)


def test_check_data_sources_accepts_prefixed_and_listed_sources(tmp_path):
  path = tmp_path / "train.parquet"
  pq.write_table(pa.table({"data_source": VERL_SOURCES}), path)
  rewards.check_data_sources([str(path)])


def test_dapo_manager_reports_acc_and_pred():
  manager = rewards.DAPORewardManager()
  batch = {
      "responses": np.ones((2, 4), np.int32),
      "response_mask": np.ones((2, 4), np.int32),
      "response_text": ["Answer: 7", "Answer: 8"],
      "data_source": np.array(["aime2024"] * 2, dtype=object),
      "reward_model": np.array([{"ground_truth": "7"}] * 2, dtype=object),
  }
  result = manager(batch)
  assert result.reward_tensor[:, -1].tolist() == [1.0, -1.0]
  assert result.reward_extra_info["acc"] == [True, False]
  assert result.reward_extra_info["pred"] == ["7", "8"]


def test_prime_math_never_evaluates_the_response(tmp_path):
  marker = tmp_path / "pwned"
  payload = f"__import__('pathlib').Path({str(marker)!r}).touch()"
  for response in (rf"\boxed{{\pi + {payload}}}", f"The answer is [{payload}]",
                   f"The answer is Matrix([{payload}])"):
    for truth in ("3.14", r"\begin{pmatrix}1\end{pmatrix}"):
      assert prime_math.compute_score(response, truth) == 0.0
  assert not marker.exists()


def test_safe_arith_computes_literals_only():
  assert safe_arith.evaluate("2*3.14") == 6.28
  assert safe_arith.evaluate("1*pi", {"pi": 3.0}) == 3.0
  assert safe_arith.evaluate("2^3") == 1  # Python's xor, as eval reads it
  assert safe_arith.evaluate("[1, (2, 3)]") == [1, (2, 3)]
  for text in ("x", "__import__('os')", "(1).real", "'a'", "2**10**10",
               "[i for i in range(3)]"):
    with pytest.raises(safe_arith.NotArithmetic):
      safe_arith.evaluate(text)


# LaTeX -> what pylatexenc's LatexNodes2Text prints (None: not converted).
LATEX_CASES = [
    (r"\frac{1}{2}", "1/2"), (r"\frac12", "1/2"), (r"\frac{a+b}{c}", "a+b/c"),
    (r"\sqrt[3]{2}", "√(2)"), (r"\sqrt2", "√(2)"), (r"\pi r", "πr"),
    (r"a \le b", "a ≤b"), (r"\sin x", "sinx"),
    (r"\left(1, 2\right)", "(1, 2)"), (r"1{,}000", "1,000"),
    (r"1\,000", "1 000"), (r"\text{ cm}", " cm"), (r"\mbox{ cm}", ""),
    (r"\binom{5}{2}", "52"), (r"\ne 3", "3"), (r"\boxed{12}", "12"),
    (r"\begin{pmatrix}1\\2\end{pmatrix}", "[ 1; 2 ]"),
    (r"\begin{pmatrix}\frac{1}{2}\\-1\end{pmatrix}", "[ 1/2;  -1 ]"),
    ("a--b", "a–b"), (r"\alpha+\beta", "α+β"), (r"x^{2}", "x^2"),
    (r"2\times 3", "2×3"), (r"(-\infty, 2]", "(-∞, 2]"),
    (r"\{1, 2\}", "{1, 2}"), (r"\text{B}", "B"),
    (r"\mathbf{v}", None), (r"\vec{v}", None),
    (r"\begin{cases}x\end{cases}", None), (r"\[x\]", None),
    (r"\foo{x}", None), (r"\frac{1}", None),
]


@pytest.mark.parametrize("latex,text", LATEX_CASES)
def test_latex_text_matches_pylatexenc(latex, text):
  assert latex_text.to_text(latex) == text


# (truth, given, sympy.simplify((truth)-(given)) == 0 behind verl's guard).
EXPR_CASES = [
    ("3/2", "1.5", True), ("6/4", "3/2", True),
    ("(x+1)^2", "x^2+2x+1", True), ("x(x+1)", "x^2+x", True),
    ("xy", "yx", True), ("2x", "x2", True), ("sqrt(8)", "2sqrt(2)", True),
    ("0.3", "0.1+0.2", False), ("0.3", "3/10", True),
    ("0.1+0.2", "3/10.", True), ("1/3", "0.333333333333333", False),
    ("sqrt(x^2)", "x", False), ("x+y+z", "z+y+x", False),
    ("2^10", "1024", False), ("2^{3}", "8", False),
    ("x^2+2x+1", "(x+1)^2.", False), ("ln(2)+ln(3)", "ln(6)", True),
    ("pi/2", "0.5pi", True), ("(-8)^(1/3)", "-2", False),
    ("4**(1/2)", "2", True), ("1", "x/x", True), ("oo", "oo", False),
    ("1/0", "1/0", False), ("sqrt(2)/2", "1/sqrt(2)", True),
    ("x_1+x_2", "x_2+x_1", True), ("mu", "um", False), ("e^2", "ee", True),
    ("2^-1", "0.5", True), ("1e3", "1000", True), ("2.50", "2.5", True),
    ("x^x", "x**x", True), ("0.5x", "x/2", True), ("2 3", "6", True),
    ("1.5.2", "0.3", False),
]


@pytest.mark.parametrize("truth,given,equal", EXPR_CASES)
def test_expr_equal_matches_sympy(truth, given, equal):
  assert expr_equal.are_equal_under_sympy(truth, given) is equal


def test_search_r1_extraction():
  assert search_r1.extract_solution("<answer> a </answer><answer>b") == "a"
  assert search_r1.extract_solution("<answer><answer>c</answer>") == "<answer>c"
  assert search_r1.normalize_answer("The  Beatles!") == "beatles"
  assert search_r1.compute_score("<answer>no</answer>", {"target": "yes"},
                                 format_score=0.1) == 0.1


def test_geo3k_format():
  assert geo3k.format_reward("<think>a</think>b\\boxed{c}d") == 1.0
  assert geo3k.format_reward("x<think>a</think>\\boxed{c}") == 0.0
  assert geo3k.format_reward("<think>a</think>\\boxed{c") == 0.0
  assert geo3k.extract_boxed_content("no box") == "None"


PATHOLOGICAL = [
    ("numina_olympiads", r"\boxed{2^9^9^9^9}", "1"),
    ("numina_olympiads", r"\boxed{((((2**9)**9)**9)**9)**9}", "1"),
    ("numina_olympiads", r"\boxed{\pi*9**9**9**9}", "1"),
    ("numina_olympiads", r"\boxed{\pi+" + "(" * 5000 + "1" + ")" * 5000 + "}",
     "1"),
    ("numina_olympiads", r"\boxed{" + "[" * 3000 + "1" + "]" * 3000 + "}",
     r"\begin{pmatrix}1\end{pmatrix}"),
    ("numina_olympiads", "Matrix(" + "[" * 3000 + "1" + "]" * 3000 + ")",
     r"\begin{pmatrix} 1 \end{pmatrix}"),
    ("numina_olympiads", r"\pi" * 20000, "1"),
    ("numina_olympiads", r"\boxed{\pi" + "{" * 5000 + "1" + "}" * 5000 + "}",
     "1"),
    (GEO, r"\boxed{\pi" + "{" * 5000 + "1" + "}" * 5000 + "}", "1"),
    ("numina_olympiads", "1,000" * 5000, "1000"),
    ("numina_olympiads", r"\boxed{" + "9" * 999 + "^9}", "1"),
    (GEO, "<think>" + "</think>\\boxed{" * 3000, "1"),
    ("searchR1_nq", "<answer>" * 20000, {"target": ["a"]}),
    (MATH, "\\boxed{" * 20000, "1"),
]


def test_pathological_answers_are_scored_quickly():
  start = time.monotonic()
  for source, response, truth in PATHOLOGICAL:
    assert default_compute_score(source, response, truth) in (0.0, 1.0)
  assert time.monotonic() - start < 5.0


@pytest.mark.parametrize("given,truth", [("1.41421356237", "\\sqrt{2}"), ("0.7853981634", "\\frac{\\pi}{4}"),
                                         ("0.693147180560", "\\ln 2")])
def test_a_decimal_is_not_the_irrational_it_approximates(given, truth):
  # sympy keeps sqrt(2) - 1.41421356237 symbolic, so verl scores 0; a reward must not teach decimals
  assert prime_math.compute_score(f"The answer is \\boxed{{{given}}}", truth) == 0.0
  assert expr_equal.are_equal_under_sympy("pi/2", "0.5*pi")


def test_degenerate_answers_stay_cheap_and_never_raise():
  n = 12000
  matrix = "\\boxed{\\begin{pmatrix}" + "1" * n + "&2" * n + "\\end{pmatrix}}"
  start = time.perf_counter()
  assert prime_math.compute_score(matrix, "1") == 0.0
  assert prime_math.compute_score("The answer is \\boxed{(7**5100, \\pi)}", "(1, 2)") == 0.0
  assert time.perf_counter() - start < 2.0
