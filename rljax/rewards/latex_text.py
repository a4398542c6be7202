r"""LaTeX answers as plain text, the way verl's graders read them.

verl's PRM800K-style graders (numina sources, geometry3k) turn a LaTeX answer
into text with the `pylatexenc` package before comparing it. rljax does not
depend on pylatexenc; `to_text` reproduces its output for the LaTeX that
answers are written in:

- `\frac{a}{b}` -> `a/b` (no parentheses added), `\sqrt[n]{x}` -> `√(x)`
  (the index dropped), arguments braced, a single character or a macro;
- braces vanish (`{1,}000` -> `1,000`), including unbalanced ones;
- symbols become Unicode (`\pi` -> `π`, `\le` -> `≤`, `\alpha` -> `α`),
  function names become their names (`\sin` -> `sin`), and the spacing
  commands become spaces (`\,` -> ` `, `\quad` -> two spaces, `\!` -> ``);
- the macros pylatexenc does not know (`\ne`, `\lt`, `\binom`, `\left`, ...)
  vanish while their braced arguments stay, as do `\text{}`-like wrappers
  and `\boxed{}`; `\mbox`, `\texttt` and `\textsf` vanish with their
  argument; a backslash at the very end vanishes;
- `pmatrix` and `bmatrix` environments become `[ a b; c d ]`, every cell
  right-aligned to the widest;
- the space after a macro named by letters is absorbed (`\pi r` -> `πr`),
  short of a blank line.

Anything else (another environment, a font or accent command such as `\mathbf`,
`\vec`, the math-mode delimiters `\(` `\[`, a macro outside these tables,
a macro with a missing argument, groups nested beyond Python's recursion
limit) makes `to_text` return None, and the caller keeps the LaTeX as it
was, as verl does when pylatexenc fails.
"""

from __future__ import annotations

import re

_GREEK = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ϵ",
    "varepsilon": "ε", "zeta": "ζ", "eta": "η", "theta": "θ",
    "vartheta": "ϑ", "iota": "ι", "kappa": "κ", "lambda": "λ", "mu": "μ",
    "nu": "ν", "xi": "ξ", "omicron": "ο", "pi": "π", "varpi": "ϖ",
    "rho": "ρ", "varrho": "ϱ", "sigma": "σ", "varsigma": "ς", "tau": "τ",
    "upsilon": "υ", "phi": "ϕ", "varphi": "φ", "chi": "χ", "psi": "ψ",
    "omega": "ω", "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ", "Lambda": "Λ",
    "Xi": "Ξ", "Pi": "Π", "Sigma": "Σ", "Upsilon": "Υ", "Phi": "Φ",
    "Psi": "Ψ", "Omega": "Ω",
}

_OPERATORS = {
    "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "neq": "≠",
    "approx": "≈", "equiv": "≡", "sim": "∼", "simeq": "≃", "cong": "≅",
    "propto": "∝", "in": "∈", "notin": "∉", "ni": "∋", "subset": "⊂",
    "subseteq": "⊆", "supset": "⊃", "supseteq": "⊇", "cup": "∪",
    "cap": "∩", "setminus": "∖", "emptyset": "∅", "varnothing": "∅",
    "infty": "∞", "pm": "±", "mp": "∓", "times": "×", "div": "÷",
    "cdot": "·", "ast": "∗", "star": "⋆", "circ": "∘", "bullet": "∙",
    "ldots": "…", "cdots": "⋯", "vdots": "⋮", "ddots": "⋱", "dots": "…",
    "angle": "∠", "perp": "⊥", "parallel": "∥", "mid": "|", "nmid": "∤",
    "to": "→", "rightarrow": "→", "leftarrow": "←", "Rightarrow": "⇒",
    "Leftarrow": "⇐", "mapsto": "↦", "forall": "∀", "exists": "∃",
    "wedge": "∧", "vee": "∨", "oplus": "⊕", "otimes": "⊗", "prime": "'",
    "partial": "∂", "nabla": "∇", "vert": "|", "lvert": "|", "rvert": "|",
    "Vert": "‖", "langle": "⟨", "rangle": "⟩", "lfloor": "⌊",
    "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉", "backslash": "\\",
    "dagger": "†", "ell": "ℓ", "hbar": "ħ", "aleph": "ℵ", "square": "□",
    "blacksquare": "▪", "quad": "  ", "qquad": "    ",
}

_FUNCTIONS = ("sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh",
              "cosh", "tanh", "log", "ln", "exp", "max", "min", "sup", "inf",
              "lim")

# Macros that print nothing themselves; a braced group after one is an
# ordinary group and prints its content.
_SILENT = frozenset((
    "operatorname", "hbox", "boldsymbol", "displaystyle", "textstyle",
    "scriptstyle", "limits", "nolimits", "left", "right", "big", "Big",
    "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr", "ne",
    "lt", "gt", "triangle", "iff", "implies", "gets", "neg", "land", "lor",
    "degree", "cot", "sec", "csc", "lg", "gcd", "deg", "det", "dim", "ker",
    "arg", "Pr", "hom", "bmod", "pmod", "mod", "colon", "Re", "Im",
    "checkmark", "cdotp", "Box", "box", "dfrac", "tfrac", "cfrac", "binom",
    "dbinom", "tbinom",
))

# Macros that print their one argument as it is; the first ones print
# nothing when the argument is missing.
_TEXT_WRAPPERS = frozenset(("text", "textbf", "textit", "textrm", "mathrm",
                            "boxed", "fbox"))
_WRAPPERS = _TEXT_WRAPPERS | {"overline", "underline", "widehat"}

# Environments printed as `[ a b; c d ]`, every cell padded to the widest.
_MATRICES = ("pmatrix", "bmatrix")

# Macros that print nothing and swallow their argument.
_SWALLOWING = frozenset(("mbox", "texttt", "textsf"))

_WORDS = {**_GREEK, **_OPERATORS, **{f: f for f in _FUNCTIONS}}

_ESCAPES = {
    ",": " ", ";": " ", ":": " ", " ": " ", "!": "", "{": "{", "}": "}",
    "%": "%", "$": "$", "_": "_", "&": "&", "#": "#", "\\": "\n",
}

# TeX's character ligatures and active characters, longest first.
_LIGATURES = (("---", "—"), ("--", "–"), ("``", "“"), ("''", "”"),
              ("~", "\xa0"), ("&", "   "))

_MATH_MODE = ("\\(", "\\)", "\\[", "\\]")
_NAME = re.compile(r"[A-Za-z]+")
_SPACE = re.compile(r"\s*")
_ENVIRONMENT_NAME = re.compile(r"\{([A-Za-z*]+)\}")


class _Unsupported(Exception):
  """LaTeX that `to_text` does not convert."""


class _Reader:
  """A cursor over LaTeX source that converts it piece by piece."""

  def __init__(self, source: str):
    self.source = source
    self.pos = 0

  def at_end(self) -> bool:
    return self.pos >= len(self.source)

  def skip_space(self) -> bool:
    """Skips whitespace up to a paragraph break ("\\n\\n"), if any.

    Returns False when it stopped at a paragraph break.
    """
    space = _SPACE.match(self.source, self.pos).group()
    cut = space.find("\n\n")
    self.pos += len(space) if cut < 0 else cut
    return cut < 0

  def text_until_close(self) -> str:
    """Converted text up to the `}` closing the current group (or the end)."""
    out = []
    while not self.at_end():
      if self.source[self.pos] == "}":
        self.pos += 1
        return "".join(out)
      out.append(self.piece())
    return "".join(out)

  def has_argument(self) -> bool:
    """Skips space; whether an argument follows (no end, `}` or blank line)."""
    return self.skip_space() and not self.at_end() and \
        self.source[self.pos] != "}"

  def argument(self) -> str:
    """A macro argument: a braced group, a bare macro, or one character."""
    if not self.has_argument():
      raise _Unsupported("missing argument")
    if self.source[self.pos] == "{":
      self.pos += 1
      return self.text_until_close()
    if self.source[self.pos] == "\\":
      return self.macro(bare=True)
    return self.character()

  def character(self) -> str:
    """The next character, or ligature, as text."""
    for chars, text in _LIGATURES:
      if self.source.startswith(chars, self.pos):
        self.pos += len(chars)
        return text
    self.pos += 1
    return self.source[self.pos - 1]

  def optional_argument(self) -> None:
    """Skips a `[...]` optional argument, if there is one."""
    if self.skip_space() and self.source.startswith("[", self.pos):
      end = self.source.find("]", self.pos)
      if end < 0:
        raise _Unsupported("unclosed optional argument")
      self.pos = end + 1

  def macro(self, bare: bool = False) -> str:
    """Converts the macro at the cursor (which is on its backslash).

    A `bare` macro is itself another macro's argument: it takes no
    arguments of its own.
    """
    self.pos += 1
    name_match = _NAME.match(self.source, self.pos)
    if name_match is None:
      if self.at_end():
        return ""
      if self.source[self.pos] not in _ESCAPES:
        raise _Unsupported("unknown escape")
      self.pos += 1
      return _ESCAPES[self.source[self.pos - 1]]
    name = name_match.group()
    self.pos = name_match.end()
    self.skip_space()
    if bare and (name in ("frac", "sqrt", "begin") or name in _SWALLOWING
                 or name in _WRAPPERS):
      raise _Unsupported(f"\\{name} as an argument")
    if name == "begin":
      return self.matrix()
    if name == "frac":
      numerator = self.argument()
      return numerator + "/" + self.argument()
    if name == "sqrt":
      self.optional_argument()
      return "√(" + self.argument() + ")"
    if name in _SWALLOWING or name in _TEXT_WRAPPERS:
      if not self.has_argument():
        return ""
      text = self.argument()
      return "" if name in _SWALLOWING else text
    if name in _WRAPPERS:
      return self.argument()
    if name in _SILENT:
      return ""
    if name in _WORDS:
      return _WORDS[name]
    raise _Unsupported(f"\\{name}")

  def environment_name(self) -> str:
    """The `{name}` after `\\begin` or `\\end`."""
    match = _ENVIRONMENT_NAME.match(self.source, self.pos)
    if match is None:
      raise _Unsupported("environment without a name")
    self.pos = match.end()
    return match.group(1)

  def matrix(self) -> str:
    """A matrix environment (the cursor after `\\begin`) as `[ a b; c d ]`."""
    name = self.environment_name()
    if name not in _MATRICES:
      raise _Unsupported(f"environment {name}")
    end = f"\\end{{{name}}}"
    rows, cells, cell, pending = [], [], [], False
    while not self.source.startswith(end, self.pos):
      if self.at_end() or self.source[self.pos] == "}":
        raise _Unsupported(f"unclosed {name}")
      if self.source.startswith("\\\\", self.pos) or \
          self.source[self.pos] == "&":
        if pending:
          cells.append("".join(cell).strip())
        cell, pending = [], False
        if self.source[self.pos] == "&":
          self.pos += 1
        else:
          self.pos += 2
          rows.append(cells)
          cells = []
        continue
      cell.append(self.piece())
      pending = True
    self.pos += len(end)
    if pending:
      cells.append("".join(cell).strip())
    rows.append(cells)
    width = max((len(c) for row in rows for c in row), default=None)
    if width is None:
      raise _Unsupported("empty matrix")
    return "[ " + "; ".join(" ".join(c.rjust(width) for c in row)
                            for row in rows) + " ]"

  def piece(self) -> str:
    """Converts the next character, ligature, group or macro."""
    ch = self.source[self.pos]
    if ch == "\\":
      return self.macro()
    if ch == "{":
      self.pos += 1
      return self.text_until_close()
    if ch == "}":
      self.pos += 1
      return ""
    return self.character()


def to_text(latex: str) -> str | None:
  """`latex` as pylatexenc's LatexNodes2Text prints it, or None."""
  if any(mark in latex for mark in _MATH_MODE):
    return None
  reader = _Reader(latex)
  out = []
  try:
    while not reader.at_end():
      out.append(reader.piece())
  except (_Unsupported, RecursionError):
    return None
  return "".join(out)
