r"""MATH rule reward (verl's `math_reward`): the last \boxed{...} answer.

The answer is the content of the response's last `\boxed{...}`, braces
matched so nested braces survive (`\boxed{\frac{1}{2}}` -> `\frac{1}{2}`),
compared with the ground truth after the MATH normalisation of
`rljax.rewards.mathd` (so `\dfrac12`, `0.5` and `1/2` all match
`\frac{1}{2}`, and `x = 3` matches `3`). As in verl:

- `\boxed 7` (a space, no braces) is read up to the next `$`; when a
  response has any `\boxed ` the last one wins over every `\boxed{`.
- `\fbox{7}` and other spellings (`\boxed7`) score 0: verl finds the box
  but cannot unwrap it.
- No numeric comparison: `\boxed{1,000}` does not match `1000`, nor
  `\boxed{2.50}` `2.5`.
- The ground truth is compared as given, not unboxed.
"""

from __future__ import annotations

from rljax.rewards import mathd

_BOX = "\\boxed"
_SPACED_BOX = "\\boxed "
_BRACED_BOX = "\\boxed{"


def matched_braces_end(text: str, start: int) -> int | None:
  """Index of the `}` that closes the first `{` at or after `start`, or None.

  Counting starts at `start`, so a stray `}` before the first `{` leaves
  the count negative and that group never closes at zero.
  """
  depth = 0
  for i in range(start, len(text)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        return i
  return None


def last_boxed_only_string(text: str) -> str | None:
  r"""The last box with its command (`\boxed{5}`, `\boxed 5`, `\fbox{5}`).

  Returns None when there is no box, or its braces never close.
  """
  if _SPACED_BOX in text:
    return _SPACED_BOX + text.split(_SPACED_BOX)[-1].split("$")[0]
  start = text.rfind(_BOX)
  if start < 0:
    start = text.rfind("\\fbox")
    if start < 0:
      return None
  end = matched_braces_end(text, start)
  return None if end is None else text[start:end + 1]


def remove_boxed(box: str) -> str | None:
  r"""`\boxed{x}` or `\boxed x` -> `x`; None for any other box."""
  if _SPACED_BOX in box:
    return box[len(_SPACED_BOX):] if box.startswith(_SPACED_BOX) else None
  if box.startswith(_BRACED_BOX) and box.endswith("}"):
    return box[len(_BRACED_BOX):-1]
  return None


def last_boxed(text: str) -> str | None:
  r"""Content of the last `\boxed{...}` / `\boxed x`, or None."""
  box = last_boxed_only_string(text)
  return None if box is None else remove_boxed(box)


def compute_score(solution_str: str, ground_truth: str) -> float:
  r"""1.0 when the last \boxed{} answer equals `ground_truth`, else 0.0."""
  answer = last_boxed(solution_str)
  if answer is None:
    return 0.0
  return 1.0 if mathd.is_equiv(answer, ground_truth) else 0.0
