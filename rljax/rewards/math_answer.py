r"""MATH rule reward: the last \boxed{...} answer against the ground truth.

The answer is the content of the response's last `\boxed{...}` (or
`\fbox{...}`, or `\boxed 5`), braces matched so nested braces survive
(`\boxed{\frac{1}{2}}` -> `\frac{1}{2}`). When the `math_verify` package is
installed it decides equivalence; otherwise both sides are normalised
(spacing, `\left`/`\right`, `\dfrac`, units, `0.5` vs `.5`, `a/b` vs
`\frac{a}{b}`, ...) and compared as strings, then as numbers.
"""

from __future__ import annotations

import re

try:
  import math_verify
except ImportError:
  math_verify = None

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
  r"""Content of the last \boxed{...} / \fbox{...} / `\boxed x`, or None.

  Returns None when the last box's braces never close.
  """
  start = max(text.rfind(c) for c in _BOX_COMMANDS)
  if start < 0:
    return None
  command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
  rest = text[start + len(command):]
  if rest.startswith(" "):
    return rest[1:].split("$")[0].strip() or None
  if not rest.startswith("{"):
    return None
  depth = 0
  for i, ch in enumerate(rest):
    if ch == "{":
      depth += 1
    elif ch == "}":
      depth -= 1
      if depth == 0:
        return rest[1:i]
  return None


def _fix_fracs(s: str) -> str:
  r"""\frac12 -> \frac{1}{2}; \frac1{2} -> \frac{1}{2}."""
  parts = s.split("\\frac")
  out = parts[0]
  for part in parts[1:]:
    out += "\\frac"
    if part.startswith("{") or len(part) < 2:
      out += part
      continue
    a, b, tail = part[0], part[1], part[2:]
    out += "{" + a + "}" + (b + tail if b == "{" else "{" + b + "}" + tail)
  return out


def _fix_slash(s: str) -> str:
  r"""3/4 -> \frac{3}{4} (integers only)."""
  m = re.fullmatch(r"(-?\d+)/(\d+)", s)
  return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else s


def _fix_sqrt(s: str) -> str:
  r"""\sqrt2 -> \sqrt{2}."""
  return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def normalize(answer: str) -> str:
  """A canonical string form of a MATH answer."""
  s = answer.strip().replace("\n", "").replace("\\!", "")
  s = s.replace("\\\\", "\\")
  s = s.replace("tfrac", "frac").replace("dfrac", "frac")
  s = s.replace("\\left", "").replace("\\right", "")
  s = s.replace("^{\\circ}", "").replace("^\\circ", "")
  s = s.replace("\\$", "").replace("$", "")
  s = s.replace("\\%", "").replace("%", "")
  s = re.sub(r"\\text\{\s*[a-zA-Z ]*\}\s*$", "", s)
  s = re.sub(r"\\(?:text|mbox|mathrm)\{([^{}]*)\}", r"\1", s)
  s = s.strip()
  if "=" in s and len(s.split("=")[0].strip()) <= 2:
    s = s.split("=", 1)[1]
  s = s.replace(" ", "").rstrip(".")
  s = re.sub(r"(?<![\d])\.(\d)", r"0.\1", s)
  s = _fix_sqrt(_fix_fracs(s))
  if s == "0.5":
    s = "\\frac{1}{2}"
  s = _fix_slash(s)
  s = re.sub(r"^(-?\d+)\.0+$", r"\1", s)
  return s


def _as_number(s: str) -> float | None:
  m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", s)
  if m and int(m.group(2)):
    return int(m.group(1)) / int(m.group(2))
  try:
    return float(s.replace(",", ""))
  except ValueError:
    return None


def is_equivalent(answer: str, ground_truth: str) -> bool:
  """Normalised string equality, else numeric equality."""
  a, b = normalize(answer), normalize(ground_truth)
  if a == b:
    return True
  x, y = _as_number(a), _as_number(b)
  return x is not None and y is not None and abs(x - y) <= 1e-9 * max(1, abs(y))


def _verify(answer: str, ground_truth: str) -> bool | None:
  """math_verify's verdict, or None when it is absent or fails."""
  if math_verify is None:
    return None
  try:
    gold = math_verify.parse(f"${ground_truth}$")
    pred = math_verify.parse(f"${answer}$")
    return bool(math_verify.verify(gold, pred))
  except Exception:  # pylint: disable=broad-except
    return None


def compute_score(solution_str: str, ground_truth: str) -> float:
  r"""1.0 when the last \boxed{} answer equals `ground_truth`, else 0.0."""
  answer = last_boxed(solution_str)
  if answer is None:
    return 0.0
  truth = last_boxed(ground_truth) or ground_truth
  return 1.0 if _verify(answer, truth) or is_equivalent(answer, truth) else 0.0
