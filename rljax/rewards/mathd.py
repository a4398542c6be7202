r"""The MATH dataset's answer normalisation (Hendrycks et al.), as verl uses it.

`strip_string` rewrites an answer into a canonical string: `\dfrac` and
`\tfrac` become `\frac`, `\frac12` becomes `\frac{1}{2}`, `\sqrt2` becomes
`\sqrt{2}`, `\left`/`\right`, degrees, `\$`, `\%`, spaces and a units suffix
written as `\text{ ...}` go, a leading `x =` (two characters at most before
the `=`) goes, `.5` gains its `0`, `0.5` becomes `\frac{1}{2}` and `3/4`
becomes `\frac{3}{4}`. Nothing else changes: `1,000` stays `1,000`.

Some inputs make the reference implementation fail (a second `\text{ `, a
`\sqrt` or `\frac` with nothing after it); `strip_string` returns None for
those, and `is_equiv` then compares the raw strings, as verl does.
"""

from __future__ import annotations

import re

_UNITS_MARK = "\\text{ "


def fix_fracs(s: str) -> str | None:
  r"""`\frac12` -> `\frac{1}{2}`, `\frac1{2}` -> `\frac{1}{2}`.

  A `\frac` followed by a single character leaves the whole string as it
  was; one followed by nothing is a failure (None).
  """
  head, *rest = s.split("\\frac")
  out = [head]
  for part in rest:
    if not part:
      return None
    if part[0] == "{":
      out.append("\\frac" + part)
    elif len(part) < 2:
      return s
    elif part[1] == "{":
      out.append("\\frac{" + part[0] + "}" + part[1:])
    else:
      out.append("\\frac{" + part[0] + "}{" + part[1] + "}" + part[2:])
  return "".join(out)


def fix_sqrt(s: str) -> str | None:
  r"""`\sqrt3` -> `\sqrt{3}`; None when a `\sqrt` has nothing after it."""
  head, *rest = s.split("\\sqrt")
  out = [head]
  for part in rest:
    if not part:
      return None
    if part[0] == "{":
      out.append("\\sqrt" + part)
    else:
      out.append("\\sqrt{" + part[0] + "}" + part[1:])
  return "".join(out)


def fix_slash(s: str) -> str:
  r"""`a/b` of two plainly written integers -> `\frac{a}{b}`."""
  parts = s.split("/")
  if len(parts) != 2:
    return s
  try:
    a, b = int(parts[0]), int(parts[1])
  except ValueError:
    return s
  if s != f"{a}/{b}":
    return s
  return f"\\frac{{{a}}}{{{b}}}"


def drop_units(s: str) -> str | None:
  r"""Text before a `\text{ ` units suffix; None when there are two."""
  if _UNITS_MARK not in s:
    return s
  parts = s.split(_UNITS_MARK)
  return parts[0] if len(parts) == 2 else None


def strip_string(s: str, drop_plain_percent: bool = False) -> str | None:
  r"""The canonical form of a MATH answer, or None where verl's fails.

  Args:
    s: the answer.
    drop_plain_percent: also drop a bare `%` (mathruler's variant, used for
      geometry3k); verl's own drops `\%` only.
  """
  for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"),
                   ("dfrac", "frac"), ("\\left", ""), ("\\right", ""),
                   ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
    s = s.replace(old, new)
  s = drop_units(s)
  if s is None:
    return None
  percents = ("\\%", "%") if drop_plain_percent else ("\\\\%", "\\%")
  for mark in percents:
    s = s.replace(mark, "")
  s = s.replace(" .", " 0.").replace("{.", "{0.")
  if not s:
    return s
  if s[0] == ".":
    s = "0" + s
  sides = s.split("=")
  if len(sides) == 2 and len(sides[0]) <= 2:
    s = sides[1]
  s = fix_sqrt(s)
  if s is None:
    return None
  s = fix_fracs(s.replace(" ", ""))
  if s is None:
    return None
  if s == "0.5":
    s = "\\frac{1}{2}"
  return fix_slash(s)


def is_equiv(answer: str, truth: str) -> bool:
  """Equal after `strip_string`; the raw strings when either cannot be."""
  a, b = strip_string(answer), strip_string(truth)
  if a is None or b is None:
    return answer == truth
  return a == b


def normalize_answer(answer: str, drop_plain_percent: bool = False) -> str:
  r"""PRM800K's MATH normalisation: trimmed, one enclosing `\text{}` removed,
  then `strip_string` (the unstripped text where that fails)."""
  answer = answer.strip()
  enclosed = re.search(r"^\\text\{(?P<text>.+?)\}$", answer)
  if enclosed is not None:
    answer = enclosed.group("text").strip()
  stripped = strip_string(answer, drop_plain_percent)
  return answer if stripped is None else stripped
