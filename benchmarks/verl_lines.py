#!/usr/bin/env python3
"""How many of verl's example launch lines does `python -m rljax.train ... --dry_run` accept?

Run from the repository's root (it imports tests.data.conftest for the tiny tokenizer and parquet rows), with a
git directory of verl (a clone, or a bare mirror such as the `fetch` tool's):

    python benchmarks/verl_lines.py --verl_git PATH/TO/verl/.git [--out verl_lines.txt] [--jobs 1]
        [--only SUBSTRING] [--base auto|grpo|ppo|verl] [--parse_only]

For every `examples/**/*.sh` of verl's HEAD that runs `verl.trainer.main_ppo`, the script
  1. checks the verl tree out (git archive) into WORKDIR/verl, which is the cwd of every run (verl's scripts are
     run from the repository root: `$(pwd)`, relative file paths and `--config-path` resolve against it);
  2. reads the script with a small static shell evaluator (nothing in the script is executed): assignments,
     `export`, arrays, `${VAR:-default}` and the other parameter expansions, `$((...))`, `$(pwd)`, `$(date ...)`,
     `$(dirname ...)`/`cd ... && pwd`, `if`/`[ ]`/`[[ ]]` where the condition can be decided; a value that cannot be
     decided makes the line "unresolvable" (naming the variable) unless it only feeds a key replaced below;
  3. replaces model paths with a tiny llama directory (a tiny MiMo where the line turns model.mtp on) and data files
     with a tiny parquet;
  4. runs `python -m rljax.train <args> --dry_run` on CPU with trainer.n_gpus_per_node * trainer.nnodes host
     devices (120 s timeout) and classifies: accepted / refused (exit 2 with a one-line error) / crashed
     (anything else: traceback, timeout) / unresolvable.

Lines without `--config-name` get rljax's experiment file the way docs/coming_from_verl.md says (`--base auto`:
configs/ppo.py when algorithm.adv_estimator is gae or unset, verl's default, else configs/grpo.py; `--base verl`
gives them verl's own verl/trainer/config/ppo_trainer.yaml instead, as main_ppo does).
"""

from __future__ import annotations

import argparse
import ast
import collections
import concurrent.futures
import copy
import datetime
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import io

VERL_GIT = os.environ.get("RLJAX_VERL_GIT", "/work/.mirror/volcengine+verl/repo")  # --verl_git sets it
RLJAX_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN_MODULE = "verl.trainer.main_ppo"
FIXED_NOW = datetime.datetime(2026, 1, 1, 0, 0, 0)

# ----------------------------------------------------------------------------------------------------------------
# Unresolved values travel inside strings as a sentinel, so that any value built from one is unresolved too.
# ----------------------------------------------------------------------------------------------------------------
_U = "\x00U{}\x00"
_U_RE = re.compile("\x00U(.*?)\x00", re.S)


def unresolved(reason: str) -> str:
  # no whitespace inside: an unquoted expansion's field splitting must keep the sentinel whole
  return _U.format(re.sub(r"\s", "\x01", reason.replace("\x00", "")))


def reasons(text: str) -> list[str]:
  return list(dict.fromkeys(r.replace("\x01", " ") for r in _U_RE.findall(text)))


def placeholder(text: str) -> str:
  return _U_RE.sub("UNRESOLVED", text)


def is_unresolved(text) -> bool:
  if isinstance(text, list):
    return any(is_unresolved(t) for t in text)
  return "\x00U" in text


class ShellError(Exception):
  """Shell text this evaluator does not understand."""


# ----------------------------------------------------------------------------------------------------------------
# Lexer: script text -> tokens. WORD tokens keep their quotes (expanded later); comments, redirections and
# here-documents are dropped.
# ----------------------------------------------------------------------------------------------------------------
OPERATORS = ["&&", "||", ";;", "|&", ";", "&", "|", "(", ")"]
REDIRECT = re.compile(r"(\d*)(&>>|&>|>>|>&|<&|<<<|<<-|<<|>\||<>|>|<)")
ASSIGN_WORD = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*)(\[[^\]]*\])?(\+?)=")


class Lexer:

  def __init__(self, text: str):
    self.text, self.pos, self.line = text, 0, 1
    self.tokens: list[tuple] = []
    self.heredocs: list[tuple[str, bool]] = []
    self.notes: list[str] = []

  def peek(self, k=0):
    p = self.pos + k
    return self.text[p] if p < len(self.text) else ""

  def emit(self, *tok):
    self.tokens.append(tok + (self.line,))

  def run(self) -> list[tuple]:
    text = self.text
    at_command_start = True
    while self.pos < len(text):
      c = text[self.pos]
      if c in " \t\r":
        self.pos += 1
        continue
      if c == "\\" and self.peek(1) == "\n":
        self.pos += 2
        self.line += 1
        self._skip_comment_lines_in_continuation()
        continue
      m = re.compile(r"\\[ \t]+(#[^\n]*)?\n").match(text, self.pos)
      if m:  # `\ ` + comment or trailing blanks: meant as a continuation
        self.notes.append(f"line {self.line}: backslash followed by {'a comment' if m.group(1) else 'blanks'} read "
                          "as a line continuation; bash would pass ' ' as an argument and end the command there")
        self.pos = m.end()
        self.line += 1
        self._skip_comment_lines_in_continuation()
        continue
      if c == "\n":
        self.emit("NL")
        self.pos += 1
        self.line += 1
        self._read_heredocs()
        at_command_start = True
        continue
      if c == "#":
        while self.pos < len(text) and text[self.pos] != "\n":
          self.pos += 1
        continue
      if at_command_start and text.startswith("[[", self.pos) and self.peek(2) in " \t":
        end = text.find("]]", self.pos + 2)
        while end != -1 and not (text[end - 1] in " \t"):
          end = text.find("]]", end + 2)
        if end == -1:
          raise ShellError(f"line {self.line}: unterminated [[")
        inner = text[self.pos + 2:end]
        self.emit("DBRACKET", inner)
        self.line += inner.count("\n")
        self.pos = end + 2
        at_command_start = False
        continue
      m = REDIRECT.match(text, self.pos)
      if m and (m.group(1) == "" or True):
        op = m.group(2)
        self.pos = m.end()
        while self.peek() in (" ", "\t"):
          self.pos += 1
        target = self.read_word()
        if op in ("<<", "<<-"):
          delim = target.replace("'", "").replace('"', "").replace("\\", "")
          self.heredocs.append((delim, op == "<<-"))
        continue
      op = next((o for o in OPERATORS if text.startswith(o, self.pos)), None)
      if op:
        self.emit("OP", op)
        self.pos += len(op)
        at_command_start = op != ")"
        continue
      word = self.read_word()
      m = ASSIGN_WORD.match(word)
      if m and m.end() == len(word) and self.peek() == "(":
        self.pos += 1
        self.emit("ARRAY", m.group(1), m.group(3) == "+", self.read_array())
        at_command_start = False
        continue
      self.emit("WORD", word)
      at_command_start = word in ("then", "do", "else", "elif", "if", "while", "until", "{", "!", "time")
    self.emit("NL")
    return self.tokens

  def _skip_comment_lines_in_continuation(self):
    """A comment line inside a backslash-continued command: dropped, the command goes on (as the brief asks; bash
    itself ends the command at such a line, which is noted)."""
    while True:
      m = re.match(r"[ \t]*(#[^\n]*)?\n", self.text[self.pos:])
      if not m:
        return
      if m.group(1) is None:  # an empty line ends the command (in bash too)
        return
      self.notes.append(f"line {self.line}: comment line inside a continued command dropped ({m.group(1)[:60]!r}); "
                        "bash would end the command there")
      self.pos += m.end()
      self.line += 1

  def _read_heredocs(self):
    for delim, strip in self.heredocs:
      while self.pos < len(self.text):
        end = self.text.find("\n", self.pos)
        end = len(self.text) if end == -1 else end
        line = self.text[self.pos:end]
        self.pos = end + 1
        self.line += 1
        if (line.lstrip("\t") if strip else line) == delim:
          break
    self.heredocs = []

  def read_array(self) -> list[str]:
    words = []
    while True:
      c = self.peek()
      if c == "":
        raise ShellError(f"line {self.line}: unterminated array")
      if c in " \t\r":
        self.pos += 1
      elif c == "\n":
        self.pos += 1
        self.line += 1
      elif c == "\\" and self.peek(1) == "\n":
        self.pos += 2
        self.line += 1
      elif c == "#":
        while self.peek() not in ("\n", ""):
          self.pos += 1
      elif c == ")":
        self.pos += 1
        return words
      else:
        words.append(self.read_word())

  def read_word(self) -> str:
    text, out = self.text, []
    while self.pos < len(text):
      c = text[self.pos]
      if c in " \t\r\n;&|<>()":
        break
      if c == "\\":
        if self.peek(1) == "\n":
          self.pos += 2
          self.line += 1
          continue
        out.append(text[self.pos:self.pos + 2])
        self.pos += 2
      elif c == "'":
        end = text.find("'", self.pos + 1)
        if end == -1:
          raise ShellError(f"line {self.line}: unterminated '")
        out.append(text[self.pos:end + 1])
        self.line += text.count("\n", self.pos, end)
        self.pos = end + 1
      elif c == '"':
        end = scan_double_quoted(text, self.pos + 1)
        out.append(text[self.pos:end + 1])
        self.line += text.count("\n", self.pos, end)
        self.pos = end + 1
      elif c == "`":
        end = scan_backtick(text, self.pos + 1)
        out.append(text[self.pos:end + 1])
        self.pos = end + 1
      elif c == "$" and self.peek(1) in ("(", "{"):
        end = scan_balanced(text, self.pos + 1)
        out.append(text[self.pos:end + 1])
        self.line += text.count("\n", self.pos, end)
        self.pos = end + 1
      else:
        out.append(c)
        self.pos += 1
    return "".join(out)


def scan_double_quoted(text: str, pos: int) -> int:
  """Index of the closing `"` of a double-quoted string whose body starts at pos."""
  while pos < len(text):
    c = text[pos]
    if c == "\\":
      pos += 2
    elif c == '"':
      return pos
    elif c == "$" and pos + 1 < len(text) and text[pos + 1] in "({":
      pos = scan_balanced(text, pos + 1) + 1
    elif c == "`":
      pos = scan_backtick(text, pos + 1) + 1
    else:
      pos += 1
  raise ShellError('unterminated "')


def scan_backtick(text: str, pos: int) -> int:
  while pos < len(text):
    if text[pos] == "\\":
      pos += 2
    elif text[pos] == "`":
      return pos
    else:
      pos += 1
  raise ShellError("unterminated `")


def scan_balanced(text: str, pos: int) -> int:
  """text[pos] is `(` or `{`: index of its match, skipping quotes."""
  open_c = text[pos]
  close_c = ")" if open_c == "(" else "}"
  depth, pos = 0, pos
  while pos < len(text):
    c = text[pos]
    if c == "\\":
      pos += 2
      continue
    if c == "'" and open_c == "(" or (c == "'" and open_c == "{" and False):
      end = text.find("'", pos + 1)
      if end == -1:
        raise ShellError("unterminated '")
      pos = end + 1
      continue
    if c == '"':
      pos = scan_double_quoted(text, pos + 1) + 1
      continue
    if c == "`":
      pos = scan_backtick(text, pos + 1) + 1
      continue
    if c == "$" and pos + 1 < len(text) and text[pos + 1] in "({":
      pos = scan_balanced(text, pos + 1) + 1
      continue
    if c == open_c:
      depth += 1
    elif c == close_c:
      depth -= 1
      if depth == 0:
        return pos
    pos += 1
  raise ShellError(f"unterminated {open_c}")


# ----------------------------------------------------------------------------------------------------------------
# Parser: tokens -> nodes.
#   ("cmd", words, arrays, connective, line)       connective: how it joins the previous command ("&&", "||", None)
#   ("test2", inner_text, connective, line)        [[ ... ]]
#   ("if", [(cond_nodes, body_nodes)], else_nodes, line)
#   ("loop", kind, header_words, body_nodes, line)
#   ("func", name, body_nodes, line)
#   ("group", body_nodes, line)
#   ("opaque", kind, words, line)                  case ... esac
# ----------------------------------------------------------------------------------------------------------------
RESERVED_END = {"fi", "then", "elif", "else", "do", "done", "esac", "}"}


class Parser:

  def __init__(self, tokens):
    self.toks, self.i = tokens, 0

  def peek(self):
    return self.toks[self.i] if self.i < len(self.toks) else ("EOF", 0)

  def next(self):
    tok = self.peek()
    self.i += 1
    return tok

  def skip_separators(self):
    while self.peek()[0] in ("NL",) or (self.peek()[0] == "OP" and self.peek()[1] in (";", "&")):
      self.i += 1

  def is_word(self, *values):
    tok = self.peek()
    return tok[0] == "WORD" and tok[1] in values

  def expect_word(self, value):
    tok = self.next()
    if tok[0] != "WORD" or tok[1] != value:
      raise ShellError(f"line {tok[-1]}: expected {value!r}, got {tok[:2]}")

  def parse_list(self, stop=()) -> list:
    nodes, connective = [], None
    while True:
      self.skip_separators() if connective is None else None
      tok = self.peek()
      if tok[0] == "EOF":
        return nodes
      if tok[0] == "WORD" and tok[1] in stop:
        return nodes
      if tok[0] == "OP" and tok[1] == ")" and ")" in stop:
        return nodes
      node = self.parse_command(connective)
      if node is not None:
        nodes.append(node)
      tok = self.peek()
      if tok[0] == "OP" and tok[1] in ("&&", "||"):
        connective = tok[1]
        self.i += 1
        while self.peek()[0] == "NL":
          self.i += 1
      elif tok[0] == "OP" and tok[1] in ("|", "|&"):
        connective = "|"
        self.i += 1
        while self.peek()[0] == "NL":
          self.i += 1
      else:
        connective = None

  def parse_command(self, connective):
    tok = self.peek()
    line = tok[-1]
    if tok[0] == "DBRACKET":
      self.i += 1
      return ("test2", tok[1], connective, line)
    if tok[0] == "WORD" and tok[1] == "!":
      self.i += 1
      node = self.parse_command(connective)
      return ("not", node, connective, line)
    if tok[0] == "WORD" and tok[1] == "if":
      self.i += 1
      branches, else_body = [], []
      cond = self.parse_list(stop=("then",))
      self.expect_word("then")
      body = self.parse_list(stop=("elif", "else", "fi"))
      branches.append((cond, body))
      while True:
        if self.is_word("elif"):
          self.i += 1
          cond = self.parse_list(stop=("then",))
          self.expect_word("then")
          body = self.parse_list(stop=("elif", "else", "fi"))
          branches.append((cond, body))
        elif self.is_word("else"):
          self.i += 1
          else_body = self.parse_list(stop=("fi",))
        else:
          self.expect_word("fi")
          return ("if", branches, else_body, line)
    if tok[0] == "WORD" and tok[1] in ("for", "while", "until", "select"):
      self.i += 1
      header = []
      while not self.is_word("do"):
        t = self.next()
        if t[0] == "EOF":
          raise ShellError(f"line {line}: {tok[1]} without do")
        if t[0] in ("WORD", "DBRACKET"):
          header.append(t[1])
      self.expect_word("do")
      body = self.parse_list(stop=("done",))
      self.expect_word("done")
      return ("loop", tok[1], header, body, line)
    if tok[0] == "WORD" and tok[1] == "case":
      self.i += 1
      words, depth = [], 1
      while True:
        t = self.next()
        if t[0] == "EOF":
          raise ShellError(f"line {line}: case without esac")
        if t[0] == "WORD" and t[1] == "case":
          depth += 1
        if t[0] == "WORD" and t[1] == "esac":
          depth -= 1
          if depth == 0:
            return ("opaque", "case", words, line)
        if t[0] == "WORD":
          words.append(t[1])
    if tok[0] == "WORD" and tok[1] == "{":
      self.i += 1
      body = self.parse_list(stop=("}",))
      self.expect_word("}")
      return ("group", body, line)
    if tok[0] == "OP" and tok[1] == "(":
      self.i += 1
      body = self.parse_list(stop=(")",))
      t = self.next()
      if t[:2] != ("OP", ")"):
        raise ShellError(f"line {line}: ( without )")
      return ("group", body, line)
    if tok[0] == "WORD" and tok[1] == "function":
      self.i += 1
      name = self.next()[1]
      if self.peek()[:2] == ("OP", "("):
        self.i += 2
      self.skip_separators()
      body = self.parse_command(None)
      return ("func", name, [body], line)
    # a simple command
    words, arrays = [], []
    while True:
      t = self.peek()
      if t[0] == "WORD" and not (not words and not arrays and t[1] in RESERVED_END):
        words.append(t[1])
        self.i += 1
      elif t[0] == "ARRAY":
        arrays.append((t[1], t[2], t[3]))
        words.append(None)  # keeps its place among the words
        self.i += 1
      elif t[0] == "OP" and t[1] == "(" and len(words) == 1 and self.toks[self.i + 1][:2] == ("OP", ")"):
        self.i += 2  # name() { ... }
        self.skip_separators()
        body = self.parse_command(None)
        return ("func", words[0], [body], line)
      else:
        break
    if not words:
      t = self.next()
      if t[0] in ("NL", "EOF") or (t[0] == "OP" and t[1] in (";", "&")):
        return None
      raise ShellError(f"line {line}: unexpected {t[:2]}")
    return ("cmd", words, arrays, connective, line)


# ----------------------------------------------------------------------------------------------------------------
# Evaluator.
# ----------------------------------------------------------------------------------------------------------------
class Env:

  def __init__(self, script_rel: str, repo_root: str, home: str):
    self.vars: dict[str, object] = {}
    self.funcs: dict[str, list] = {}
    self.cwd = repo_root
    self.script_rel = script_rel
    self.repo_root = repo_root
    self.home = home

  def copy(self):
    new = copy.copy(self)
    new.vars = dict(self.vars)
    new.funcs = dict(self.funcs)
    return new


ARITH_NAME = re.compile(r"(?<![0-9A-Za-z_])[A-Za-z_][A-Za-z_0-9]*")


class Evaluator:

  def __init__(self, script_rel: str, text: str, repo_root: str, home: str):
    self.text = text
    self.notes: list[str] = []
    self.optional = set(re.findall(r"\$\{([A-Za-z_][A-Za-z_0-9]*):?\+", text))  # ${X:+...}: X may be unset
    self.env = Env(script_rel, repo_root, home)
    self.found = None  # (raw args, env, context)
    self.context: list[str] = []  # undecided conditions around the current command
    self.depth = 0

  # --- values ---------------------------------------------------------------------------------------------------
  def lookup(self, name: str, env: Env):
    """Value of a name (str or list), or None when unset."""
    if name in env.vars:
      return env.vars[name]
    if name == "HOME":
      return env.home
    if name == "PWD":
      return env.cwd
    if name == "BASH_SOURCE" or name == "0":
      return [env.script_rel] if name == "BASH_SOURCE" else env.script_rel
    if name in ("@", "*"):
      return []
    if name == "#":
      return "0"
    return None

  def missing(self, name: str) -> str:
    if name in self.optional:
      return ""
    if name.isdigit():
      return unresolved(f"${name} (positional argument, no default)")
    return unresolved(f"${name} (not set in the script)")

  # --- words ----------------------------------------------------------------------------------------------------
  def expand_fields(self, raw: str, env: Env) -> list[str]:
    """A word as bash expands a command argument: quote removal, expansions, field splitting of unquoted
    expansions, "${a[@]}" as one field per element."""
    pieces = self._pieces(raw, env, quoted=False)
    fields, cur = [], None
    for kind, text in pieces:
      if kind == "break":
        fields.append(cur or "")
        cur = ""
      elif kind == "fixed":
        cur = (cur or "") + text
      else:  # splittable
        if text == "":
          continue
        parts = re.split(r"[ \t\n]+", text)
        for k, part in enumerate(parts):
          if k > 0 and cur is not None:
            fields.append(cur)
            cur = None
          if part:
            cur = (cur or "") + part
    if cur is not None:
      fields.append(cur)
    return fields

  def expand_str(self, raw: str, env: Env) -> str:
    """A word as bash expands an assignment's value: no field splitting, no globbing."""
    return "".join(" " if kind == "break" else text for kind, text in self._pieces(raw, env, quoted=False,
                                                                                     assignment=True))

  def _pieces(self, raw: str, env: Env, quoted: bool, assignment: bool = False) -> list[tuple[str, str]]:
    out, i, n = [], 0, len(raw)
    if not quoted and (raw == "~" or raw.startswith("~/")):
      out.append(("fixed", env.home))
      i = 1
    while i < n:
      c = raw[i]
      if c == "\\":
        if quoted:
          nxt = raw[i + 1] if i + 1 < n else ""
          out.append(("fixed", "" if nxt == "\n" else nxt if nxt in '$`"\\' else "\\" + nxt))
        else:
          out.append(("fixed", raw[i + 1] if i + 1 < n else ""))
        i += 2
      elif c == "'" and not quoted:
        end = raw.index("'", i + 1)
        out.append(("fixed", raw[i + 1:end]))
        i = end + 1
      elif c == '"' and not quoted:
        end = scan_double_quoted(raw, i + 1)
        inner = self._pieces(raw[i + 1:end], env, quoted=True)
        out.append(("fixed", ""))  # "" is an (empty) field
        out.extend(inner)
        i = end + 1
      elif c == "`":
        end = scan_backtick(raw, i + 1)
        value = self.command_substitution(raw[i + 1:end], env)
        out.append(("fixed" if quoted else "split", value))
        i = end + 1
      elif c == "$":
        i, pieces = self._dollar(raw, i, env, quoted)
        out.extend(pieces)
      elif c == "~" and assignment and not quoted and i > 0 and raw[i - 1] in ":=" and (
          i + 1 == n or raw[i + 1] == "/"):
        out.append(("fixed", env.home))
        i += 1
      else:
        out.append(("fixed", c))
        i += 1
    return out

  def _dollar(self, raw: str, i: int, env: Env, quoted: bool):
    kind = "fixed" if quoted else "split"
    nxt = raw[i + 1] if i + 1 < len(raw) else ""
    if raw.startswith("$((", i):
      end = scan_balanced(raw, i + 1)
      inner = raw[i + 3:end - 1]
      if raw[end - 1] != ")":  # $( (...) ) is a command substitution of a subshell
        return end + 1, [(kind, self.command_substitution(raw[i + 2:end], env))]
      return end + 1, [(kind, self.arithmetic(inner, env))]
    if nxt == "(":
      end = scan_balanced(raw, i + 1)
      return end + 1, [(kind, self.command_substitution(raw[i + 2:end], env))]
    if nxt == "{":
      end = scan_balanced(raw, i + 1)
      return end + 1, self.parameter(raw[i + 2:end], env, quoted)
    m = re.match(r"[A-Za-z_][A-Za-z_0-9]*|[0-9@*#?$!-]", raw[i + 1:])
    if not m:
      return i + 1, [("fixed", "$")]
    name = m.group(0)
    return i + 1 + len(name), self._value_pieces(name, None, env, quoted)

  def _value_pieces(self, name, index, env, quoted):
    kind = "fixed" if quoted else "split"
    value = self.lookup(name, env)
    if value is None:
      return [(kind, self.missing(name))]
    if isinstance(value, list):
      if index in ("@", "*"):
        if quoted and index == "@":
          pieces = []
          for k, v in enumerate(value):
            if k:
              pieces.append(("break", ""))
            pieces.append(("fixed", v))
          return pieces
        return [(kind, " ".join(value))]
      idx = 0 if index is None else int(self.arithmetic(index, env) or 0) if not is_unresolved(
          self.arithmetic(index, env)) else None
      if idx is None:
        return [(kind, unresolved(f"${{{name}[{index}]}}"))]
      return [(kind, value[idx] if idx < len(value) else "")]
    if index not in (None, "0", "@", "*"):
      return [(kind, "")]
    return [(kind, value)]

  def parameter(self, inner: str, env: Env, quoted: bool):
    kind = "fixed" if quoted else "split"
    if inner.startswith("#") and len(inner) > 1:
      m = re.fullmatch(r"#([A-Za-z_][A-Za-z_0-9]*)(\[[@*]\])?", inner)
      if not m:
        return [(kind, unresolved("${" + inner + "}"))]
      value = self.lookup(m.group(1), env)
      if value is None:
        return [(kind, self.missing(m.group(1)))]
      if isinstance(value, list):
        return [(kind, str(len(value)) if m.group(2) else str(len(value[0]) if value else 0))]
      return [(kind, str(len(value)))]
    m = re.match(r"([A-Za-z_][A-Za-z_0-9]*|[0-9]+|[@*#?$!])(\[([^\]]*)\])?", inner)
    if not m:
      return [(kind, unresolved("${" + inner + "}"))]
    name, index = m.group(1), m.group(3)
    rest = inner[m.end():]
    value = self.lookup(name, env)
    if isinstance(value, list) and index is None:
      scalar = value[0] if value else ""
    elif isinstance(value, list):
      scalar = " ".join(value) if index in ("@", "*") else None
    else:
      scalar = value
    if not rest:
      return self._value_pieces(name, index, env, quoted)
    op_m = re.match(r":-|:=|:\+|:\?|-|=|\+|\?|//|/|##|#|%%|%|\^\^|,,|:", rest)
    if not op_m:
      return [(kind, unresolved("${" + inner + "}"))]
    op, word = op_m.group(0), rest[op_m.end():]
    if isinstance(value, list) and index not in (None, "@", "*"):
      idx = self.arithmetic(index, env)
      scalar = value[int(idx)] if not is_unresolved(idx) and int(idx) < len(value) else None
    is_set = scalar is not None
    is_null = not is_set or scalar == ""
    if op in (":-", "-", ":=", "="):
      use_word = is_null if op.startswith(":") else not is_set
      if use_word:
        result = self.expand_str(word, env)
        if op in (":=", "="):
          env.vars[name] = result
        return [(kind, result)]
      return self._value_pieces(name, index, env, quoted)
    if op in (":+", "+"):
      use_word = not is_null if op.startswith(":") else is_set
      return [(kind, self.expand_str(word, env) if use_word else "")]
    if op in (":?", "?"):
      if is_null if op.startswith(":") else not is_set:
        return [(kind, unresolved(f"${{{name}}} (script requires it: ${{{inner}}})"))]
      return self._value_pieces(name, index, env, quoted)
    if not is_set:
      return [(kind, self.missing(name))]
    if is_unresolved(scalar):
      return [(kind, scalar)]
    if op in ("//", "/"):
      pattern, _, replacement = word.partition("/")
      pattern = self.expand_str(pattern, env)
      replacement = self.expand_str(replacement, env)
      if any(ch in pattern for ch in "*?["):
        return [(kind, unresolved(f"${{{inner}}} (glob pattern replacement)"))]
      result = scalar.replace(pattern, replacement) if op == "//" else scalar.replace(pattern, replacement, 1)
      return [(kind, result)]
    if op in ("#", "##", "%", "%%"):
      pattern = self.expand_str(word, env)
      regex = fnmatch.translate(pattern)[4:-3]  # strip (?s: ... )\Z
      greedy = op in ("##", "%%")
      if op.startswith("#"):
        cands = [k for k in range(len(scalar) + 1) if re.fullmatch(regex, scalar[:k], re.S)]
        if not cands:
          return [(kind, scalar)]
        return [(kind, scalar[(max(cands) if greedy else min(cands)):])]
      cands = [k for k in range(len(scalar) + 1) if re.fullmatch(regex, scalar[k:], re.S)]
      if not cands:
        return [(kind, scalar)]
      return [(kind, scalar[:(min(cands) if greedy else max(cands))])]
    if op == "^^":
      return [(kind, scalar.upper())]
    if op == ",,":
      return [(kind, scalar.lower())]
    if op == ":":
      offset, _, length = word.partition(":")
      o = self.arithmetic(offset, env)
      if is_unresolved(o):
        return [(kind, o)]
      o = int(o)
      if length:
        ln = self.arithmetic(length, env)
        if is_unresolved(ln):
          return [(kind, ln)]
        return [(kind, scalar[o:o + int(ln)])]
      return [(kind, scalar[o:])]
    return [(kind, unresolved("${" + inner + "}"))]

  # --- arithmetic -----------------------------------------------------------------------------------------------
  def arithmetic(self, text: str, env: Env, depth: int = 0) -> str:
    text = self.expand_str(text.replace('"', ""), env)
    if is_unresolved(text):
      return unresolved(f"$(({text})) uses " + "; ".join(reasons(text)))
    if depth > 20:
      return unresolved(f"$(({text})) (recursion)")

    def name_value(m):
      value = self.lookup(m.group(0), env)
      if isinstance(value, list):
        value = value[0] if value else ""
      if value is None:
        raise ShellError(f"${m.group(0)}")
      if is_unresolved(value):
        raise ShellError("; ".join(reasons(value)))
      value = value.strip() or "0"
      if not re.fullmatch(r"-?\d+", value):
        value = self.arithmetic(value, env, depth + 1)
        if is_unresolved(value):
          raise ShellError("; ".join(reasons(value)))
      return f"({value})"

    try:
      substituted = ARITH_NAME.sub(name_value, text)
    except ShellError as error:
      return unresolved(f"$(({text.strip()})) uses {error}")
    try:
      return str(_arith_eval(ast.parse(substituted.strip(), mode="eval").body))
    except Exception:  # pylint: disable=broad-except
      return unresolved(f"$(({text.strip()})) (arithmetic this script cannot evaluate)")

  # --- command substitution -------------------------------------------------------------------------------------
  def command_substitution(self, text: str, env: Env) -> str:
    try:
      nodes = Parser(Lexer(text).run()).parse_list()
      sub = env.copy()
      out = []
      self._run_captured(nodes, sub, out)
      return "".join(out).rstrip("\n")
    except ShellError as error:
      return unresolved(f"$({text.strip()}) ({error})")

  def _run_captured(self, nodes, env: Env, out: list[str]):
    for node in nodes:
      if node[0] == "func" or node[0] == "group":
        self._run_captured(node[1] if node[0] == "group" else [], env, out)
        continue
      if node[0] != "cmd":
        raise ShellError("not a simple command")
      words = []
      for raw in node[1]:
        if raw is None:
          raise ShellError("array")
        words.extend(self.expand_fields(raw, env))
      while words and ASSIGN_WORD.match(words[0]):
        words.pop(0)
      if not words:
        continue
      if any(is_unresolved(w) for w in words):
        raise ShellError("; ".join(r for w in words for r in reasons(w)))
      name, args = words[0], [w for w in words[1:] if w != "--"]
      if name == "pwd":
        out.append(env.cwd + "\n")
      elif name == "cd":
        target = args[0] if args else env.home
        env.cwd = os.path.normpath(os.path.join(env.cwd, target))
      elif name == "dirname":
        out.append((os.path.dirname(args[0].rstrip("/")) or ".") + "\n")
      elif name == "basename":
        out.append(os.path.basename(args[0].rstrip("/")) + "\n")
      elif name in ("realpath", "readlink"):
        path = [a for a in args if not a.startswith("-")][0]
        out.append(os.path.normpath(os.path.join(env.cwd, path)) + "\n")
      elif name == "date":
        fmt = next((a[1:] for a in args if a.startswith("+")), None)
        out.append((FIXED_NOW.strftime(fmt) if fmt else FIXED_NOW.strftime("%a %b %d %H:%M:%S UTC %Y")) + "\n")
      elif name == "echo":
        out.append(" ".join(a for a in args if a not in ("-n", "-e")) + "\n")
      elif name in env.funcs:
        self._run_captured(env.funcs[name], env.copy(), out)
      else:
        raise ShellError(f"runs {name}")

  # --- tests ----------------------------------------------------------------------------------------------------
  def test(self, words: list[str], env: Env):
    """[ ... ] / test / [[ ... ]] on expanded words: True, False or None (undecided)."""
    if any(is_unresolved(w) for w in words):
      return None

    def parse_or(ws):
      # "or" binds loosest; each connective has the value that decides it whatever the other side is
      for seps, deciding in ((("-o", "||"), True), (("-a", "&&"), False)):
        for sep in seps:
          if sep in ws:
            k = ws.index(sep)
            left, right = parse_or(ws[:k]), parse_or(ws[k + 1:])
            if deciding in (left, right):
              return deciding
            return None if None in (left, right) else not deciding
      if ws and ws[0] == "!":
        inner = parse_or(ws[1:])
        return None if inner is None else not inner
      if len(ws) == 0:
        return False
      if len(ws) == 1:
        return ws[0] != ""
      if len(ws) == 2:
        op, arg = ws
        if op == "-n":
          return arg != ""
        if op == "-z":
          return arg == ""
        path = os.path.join(env.cwd, os.path.expanduser(arg))
        if op in ("-f",):
          return os.path.isfile(path)
        if op in ("-d",):
          return os.path.isdir(path)
        if op in ("-e", "-r", "-s", "-x", "-w"):
          return os.path.exists(path)
        return None
      if len(ws) == 3:
        a, op, b = ws
        if op in ("=", "=="):
          return fnmatch.fnmatchcase(a, b) if any(ch in b for ch in "*?[") else a == b
        if op == "!=":
          return not (fnmatch.fnmatchcase(a, b) if any(ch in b for ch in "*?[") else a == b)
        if op == "=~":
          return re.search(b, a) is not None
        ints = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__, "-gt": int.__gt__,
                "-ge": int.__ge__}
        if op in ints:
          try:
            return ints[op](int(a), int(b))
          except ValueError:
            return None
      return None

    return parse_or(words)

  # --- statements -----------------------------------------------------------------------------------------------
  def run(self, nodes, env: Env, status=True):
    for node in nodes:
      status = self.run_node(node, env, status)
    return status

  def _connected(self, connective, status, env, fn):
    """Runs fn(env) as `prev && cmd` / `prev || cmd` would: on env, skipped, or undecided (on a copy, merged)."""
    if connective in ("&&", "||"):
      runs = status if connective == "&&" else (None if status is None else not status)
      if runs is False:
        return status
      if runs is None:
        return self.undecided([fn], env, f"`{connective}` after an undecided command")
    return fn(env)

  def undecided(self, branches, env: Env, why: str, keep_original=True):
    """Runs each branch on a copy of env; a variable left different by the branches becomes unresolved."""
    self.context.append(why)
    results = []
    try:
      for fn in branches:
        copy_env = env.copy()
        fn(copy_env)
        results.append(copy_env)
    finally:
      self.context.pop()
    if keep_original:
      results.append(env.copy())
    names = set().union(*(r.vars.keys() for r in results))
    for name in names:
      values = [r.vars.get(name) for r in results]
      if all(v == values[0] for v in values):
        if values[0] is not None:
          env.vars[name] = values[0]
      else:
        env.vars[name] = unresolved(f"${name} (set differently depending on {why})")
    for r in results:
      env.funcs.update(r.funcs)
    return None

  def run_node(self, node, env: Env, status):
    kind = node[0]
    if kind == "cmd":
      return self._connected(node[3], status, env, lambda e: self.simple(node, e))
    if kind == "test2":
      inner = Lexer(node[1]).run()
      words = []
      for t in inner:
        if t[0] in ("WORD",):
          words.extend(self.expand_fields(t[1], env) or [""])
        elif t[0] == "OP" and t[1] in ("&&", "||", "(", ")"):
          words.append(t[1])
      return self._connected(node[2], status, env, lambda e: self.test(words, e))
    if kind == "not":
      result = self.run_node(node[1], env, status)
      return None if result is None else not result
    if kind == "if":
      return self.run_if(node[1], node[2], env)
    if kind == "loop":
      header = " ".join(node[2])
      self.undecided([lambda e: self.run(node[3], e)], env, f"`{node[1]} {header}` loop (line {node[4]})")
      return True
    if kind == "func":
      env.funcs[node[1]] = node[2]
      return True
    if kind == "group":
      return self.run(node[1], env)
    if kind == "opaque":
      for word in node[2]:
        m = ASSIGN_WORD.match(word)
        if m:
          env.vars[m.group(1)] = unresolved(f"${m.group(1)} (set inside a case statement, line {node[3]})")
      return True
    raise ShellError(f"unknown node {kind}")

  def run_if(self, branches, else_body, env):
    for k, (cond, body) in enumerate(branches):
      result = self.run(cond, env)
      if result is True:
        return self.run(body, env)
      if result is None:
        rest_branches = branches[k + 1:]
        why = f"the condition at line {cond[0][-1] if cond else '?'}"
        self.undecided([lambda e, b=body: self.run(b, e),
                        lambda e: self.run_if(rest_branches, else_body, e) if rest_branches else self.run(
                            else_body, e)], env, why, keep_original=False)
        return True
    return self.run(else_body, env)

  def simple(self, node, env: Env):
    words, arrays, line = node[1], node[2], node[4]
    array_iter = iter(arrays)
    # the launch line
    if MAIN_MODULE in words:
      k = words.index(MAIN_MODULE)
      if k > 0 and words[k - 1] == "-m":
        if self.found is None:
          self.found = (words[k + 1:], env.copy(), list(self.context), line)
        else:
          self.notes.append(f"line {line}: another {MAIN_MODULE} command, ignored")
        return True
    # leading assignments
    assigns, k = [], 0
    while k < len(words):
      raw = words[k]
      if raw is None:
        assigns.append(("array", next(array_iter)))
      elif ASSIGN_WORD.match(raw):
        assigns.append(("scalar", raw))
      else:
        break
      k += 1
    rest = words[k:]
    if not rest:
      for assign in assigns:
        self.assign(assign, env)
      return True
    name_fields = self.expand_fields(rest[0], env) if rest[0] is not None else []
    name = name_fields[0] if name_fields else ""
    if name in ("export", "declare", "typeset", "local", "readonly"):
      for raw in rest[1:]:
        if raw is None:
          self.assign(("array", next(array_iter)), env)
        elif ASSIGN_WORD.match(raw):
          self.assign(("scalar", raw), env)
      return True
    if name == "unset":
      for raw in rest[1:]:
        for var in self.expand_fields(raw, env) if raw else []:
          env.vars.pop(var, None)
      return True
    if name in ("[", "test"):
      args = []
      for raw in rest[1:]:
        args.extend(self.expand_fields(raw, env) if raw else [])
      if name == "[" and args and args[-1] == "]":
        args = args[:-1]
      return self.test(args, env)
    if name in ("true", ":"):
      return True
    if name == "false":
      return False
    if name == "cd":
      target = self.expand_str(rest[1], env) if len(rest) > 1 and rest[1] not in (None, "--") else (
          self.expand_str(rest[2], env) if len(rest) > 2 else env.home)
      env.cwd = target if is_unresolved(target) else os.path.normpath(os.path.join(env.cwd, target))
      return True
    if name in ("source", "."):
      self.notes.append(f"line {line}: sources {' '.join(r or '' for r in rest[1:])} (not read)")
      return None
    if name == "read":
      for raw in rest[1:]:
        for var in self.expand_fields(raw, env) if raw else []:
          if re.fullmatch(r"[A-Za-z_]\w*", var):
            env.vars[var] = unresolved(f"${var} (set by `read`, line {line})")
      return True
    if name == "eval":
      return True
    if name in env.funcs and self.depth < 10:
      self.depth += 1
      try:
        return self.run(env.funcs[name], env)
      finally:
        self.depth -= 1
    return True

  def assign(self, assign, env: Env):
    kind, payload = assign
    if kind == "array":
      name, append, raws = payload
      values = []
      for raw in raws:
        values.extend(self.expand_fields(raw, env))
      old = env.vars.get(name, [])
      old = old if isinstance(old, list) else [old]
      env.vars[name] = (old + values) if append else values
      return
    m = ASSIGN_WORD.match(payload)
    name, index, append = m.group(1), m.group(2), m.group(3) == "+"
    value = self.expand_str(payload[m.end():], env)
    if index:
      old = env.vars.get(name, [])
      old = list(old) if isinstance(old, list) else [old]
      idx = self.arithmetic(index[1:-1], env)
      if is_unresolved(idx):
        env.vars[name] = unresolved(f"${name} (indexed by {index})")
        return
      idx = int(idx)
      old.extend([""] * (idx + 1 - len(old)))
      old[idx] = value
      env.vars[name] = old
      return
    if append:
      old = env.vars.get(name, "")
      old = old[0] if isinstance(old, list) and old else (old if isinstance(old, str) else "")
      value = old + value
    env.vars[name] = value


def _arith_eval(node):
  if isinstance(node, ast.Constant) and isinstance(node.value, int):
    return node.value
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
    value = _arith_eval(node.operand)
    return -value if isinstance(node.op, ast.USub) else value
  if isinstance(node, ast.BinOp):
    a, b = _arith_eval(node.left), _arith_eval(node.right)
    if isinstance(node.op, ast.Add):
      return a + b
    if isinstance(node.op, ast.Sub):
      return a - b
    if isinstance(node.op, ast.Mult):
      return a * b
    if isinstance(node.op, (ast.Div, ast.FloorDiv)):
      q = abs(a) // abs(b)
      return q if (a >= 0) == (b >= 0) else -q
    if isinstance(node.op, ast.Mod):
      return a - b * (abs(a) // abs(b) if (a >= 0) == (b >= 0) else -(abs(a) // abs(b)))
    if isinstance(node.op, ast.Pow):
      return a ** b
  raise ValueError("unsupported arithmetic")


# ----------------------------------------------------------------------------------------------------------------
# One launch line.
# ----------------------------------------------------------------------------------------------------------------
CONFIG_FLAGS = ("--config-path", "--config-name", "-cp", "-cn", "--config-dir", "-cd")
DROP_WORDS = {"$@", '"$@"', "$*", '"$*"', "${@}", '"${@}"'}


def is_model_key(key: str) -> bool:
  return (key.endswith(".model.path") or key == "model.path" or key.endswith("model_path")
          or key.endswith("tokenizer_path") or key.endswith(".model.input_tokenizer"))


def is_data_key(key: str) -> bool:
  return key in ("data.train_files", "data.val_files")


def override_key(arg: str) -> str | None:
  m = re.match(r"^(\+\+|\+|~)?([A-Za-z_][\w.\-/@]*)(=|$)", arg)
  return m.group(2) if m else None


def extract(script_rel: str, text: str, repo_root: str, home: str) -> dict:
  """The launch line of one script: {'status': 'ok', 'args': [...], 'notes': [...]} or {'status': 'unresolvable',
  'reasons': [...]}."""
  lexer = Lexer(text)
  try:
    tokens = lexer.run()
    nodes = Parser(tokens).parse_list()
  except (ShellError, ValueError) as error:
    return {"status": "unresolvable", "reasons": [f"shell text not understood: {error}"], "notes": lexer.notes}
  ev = Evaluator(script_rel, text, repo_root, home)
  try:
    ev.run(nodes, ev.env)
  except (ShellError, ValueError, IndexError) as error:
    return {"status": "unresolvable", "reasons": [f"shell evaluation failed: {error!r}"],
            "notes": lexer.notes + ev.notes}
  notes = lexer.notes + ev.notes
  if ev.found is None:
    return {"status": "unresolvable", "reasons": [f"no `-m {MAIN_MODULE}` command found"], "notes": notes}
  raws, env, context, line = ev.found
  if context:
    notes.append(f"line {line}: the launch line sits under {'; '.join(context)}")
  args = []
  for raw in raws:
    if raw is None:
      notes.append("array assignment inside the launch line ignored")
      continue
    if raw in DROP_WORDS or re.fullmatch(r'"?\$\{?[@*](:[^}]*)?\}?"?', raw):
      continue  # "$@", "${@:2}": the script's own arguments, none here
    args.extend(ev.expand_fields(raw, env))
  if env.cwd != repo_root:
    notes.append(f"the script cd's to {env.cwd!r} before the launch line")
  return {"status": "ok", "args": args, "notes": notes, "cwd": env.cwd}


def split_config_flags(args: list[str]) -> tuple[dict, list[str]]:
  flags, rest, k = {}, [], 0
  while k < len(args):
    arg = args[k]
    name = arg.split("=", 1)[0]
    if name in CONFIG_FLAGS:
      canon = {"-cp": "--config-path", "-cn": "--config-name", "-cd": "--config-dir"}.get(name, name)
      if "=" in arg:
        flags[canon] = arg.split("=", 1)[1]
      else:
        flags[canon] = args[k + 1] if k + 1 < len(args) else ""
        k += 1
    else:
      rest.append(arg)
    k += 1
  return flags, rest


def last_value(overrides: list[str], key: str):
  value = None
  for arg in overrides:
    if override_key(arg) == key and "=" in arg:
      value = arg.split("=", 1)[1]
    elif arg.startswith("~") and override_key(arg) == key:
      value = None
  return value


def yaml_value(path: str, dotted: str):
  try:
    import yaml  # pylint: disable=import-outside-toplevel
    with open(path) as f:
      node = yaml.safe_load(f)
    for part in dotted.split("."):
      node = node[part]
    return node
  except Exception:  # pylint: disable=broad-except
    return None


def plan(script_rel: str, extracted: dict, ctx: dict) -> dict:
  """argv, env and cwd of the dry run, or an unresolvable record."""
  result = {"script": script_rel, "notes": list(extracted.get("notes", []))}
  if extracted["status"] != "ok":
    result.update(status="unresolvable", detail="; ".join(extracted["reasons"]))
    return result
  flags, overrides = split_config_flags(extracted["args"])
  # a line training multi-token prediction layers names a model that has them (MiMo): a tiny one of that family
  mtp = str(last_value(overrides, "actor_rollout_ref.model.mtp.enable")).lower() == "true"
  model_dir = ctx["mtp_model_dir"] if mtp else ctx["model_dir"]
  bad, final = [], []
  for arg in overrides:
    key = override_key(arg)
    if key is None:
      if is_unresolved(arg):
        bad.extend(reasons(arg))
      final.append(arg)
      continue
    if is_model_key(key) and "=" in arg:
      final.append(arg.split("=", 1)[0] + "=" + model_dir)
    elif is_data_key(key) and "=" in arg:
      final.append(arg.split("=", 1)[0] + "=" + ctx["parquet"])
    else:
      if is_unresolved(arg):
        bad.extend(f"{key}: {r}" for r in reasons(arg))
      final.append(arg)
  for name, value in flags.items():
    if is_unresolved(value):
      bad.extend(f"{name}: {r}" for r in reasons(value))
  if bad:
    # the line is unresolvable; it still runs once as a probe, each unresolved value spelled UNRESOLVED
    result.update(status="unresolvable", detail="; ".join(dict.fromkeys(bad)))
    final = [placeholder(a) for a in final]
    flags = {k: placeholder(v) for k, v in flags.items()}
  # the experiment: verl's YAML file (Hydra's --config-path / --config-name) or an rljax experiment file
  config_args = []
  yaml_path = None
  repo = ctx["repo"]
  if "--config-name" in flags or "--config-path" in flags:
    name = flags.get("--config-name", "ppo_trainer")
    if "--config-name" not in flags:
      result["notes"].append("--config-path without --config-name: verl's main_ppo default ppo_trainer is used")
    file = name if name.endswith((".yaml", ".yml")) else name + ".yaml"
    cp = flags.get("--config-path", "config")
    if os.path.isabs(cp):
      candidates = [cp]
    else:
      # Hydra: relative to the file that declares @hydra.main (verl/trainer/main_ppo.py); then the cwd, the script
      candidates = [os.path.join(repo, "verl", "trainer", cp), os.path.join(extracted["cwd"], cp),
                    os.path.join(repo, os.path.dirname(script_rel), cp)]
    found = next((os.path.normpath(c) for c in candidates if os.path.isfile(os.path.join(c, file))), None)
    if found is None:
      result.update(status="unresolvable", detail="; ".join(
          bad + [f"--config-name={name}: no {file} in {', '.join(os.path.normpath(c) for c in candidates)}"]))
      result.pop("argv", None)
      return result
    if os.path.normpath(found) != os.path.normpath(candidates[0]):
      result["notes"].append(f"config file found in {os.path.relpath(found, repo)}")
    yaml_path = os.path.join(found, file)
    config_args = [f"--config-path={found}", f"--config-name={name}"]
    result["config"] = os.path.relpath(yaml_path, repo)
  else:
    base = ctx["base"]
    adv = last_value(overrides, "algorithm.adv_estimator")
    if base == "verl":
      yaml_path = os.path.join(repo, "verl", "trainer", "config", "ppo_trainer.yaml")
      config_args = [f"--config-path={os.path.dirname(yaml_path)}", "--config-name=ppo_trainer"]
      result["config"] = "verl/trainer/config/ppo_trainer.yaml (main_ppo's default)"
    else:
      name = base if base != "auto" else ("ppo" if adv in (None, "gae") else "grpo")
      config_args = [f"--config={os.path.join(RLJAX_ROOT, 'configs', name + '.py')}"]
      result["config"] = f"configs/{name}.py"
  # devices
  counts = {}
  for key, default in (("trainer.n_gpus_per_node", 8), ("trainer.nnodes", 1)):
    value = last_value(overrides, key)
    if value is None and yaml_path:
      value = yaml_value(yaml_path, key)
    if value is None:
      value = default
    try:
      counts[key] = int(str(value).strip("'\""))
    except ValueError:
      if bad:  # the probe of an unresolvable line: verl's default
        counts[key] = default
        result["notes"].append(f"probe: {key}={placeholder(str(value))} taken as {default}")
        continue
      result.update(status="unresolvable", detail=f"{key}={value!r}: not a number of devices")
      return result
  devices = counts["trainer.n_gpus_per_node"] * counts["trainer.nnodes"]
  result.update(status="unresolvable" if bad else "planned", devices=devices,
                argv=[sys.executable, "-m", "rljax.train", *config_args, *final, "--dry_run"],
                cwd=extracted["cwd"] if os.path.isdir(extracted["cwd"]) else repo)
  return result


def execute(record: dict, timeout: float) -> dict:
  if record["status"] == "unresolvable":  # a probe
    saved = {k: record.get(k) for k in ("status", "detail")}
    run_once(record, timeout)
    record["probe"] = f"{record['status']}: {record.get('detail', '')}".rstrip(": ")
    unresolved = {key.split(":")[0].strip() for key in saved["detail"].split("; ")}
    while record["status"] == "refused" and error_key(record["detail"]) in unresolved:
      # a value of another type than a string (a count, a flag): the probe leaves the key at its default
      key = error_key(record["detail"])
      unresolved.discard(key)
      record["argv"] = [a for a in record["argv"] if not a.lstrip("+").startswith(key + "=")]
      run_once(record, timeout)
      record["probe"] += f"; with {key} at its default -> {record['status']}: {record.get('detail', '')}".rstrip(": ")
    record.update(saved)
    return record
  return run_once(record, timeout)


def run_once(record: dict, timeout: float) -> dict:
  env = dict(os.environ)
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={record['devices']}"
  env["PYTHONPATH"] = os.pathsep.join(p for p in (RLJAX_ROOT, os.environ.get("PYTHONPATH")) if p)
  try:
    proc = subprocess.run(record["argv"], cwd=record["cwd"], env=env, capture_output=True, text=True,
                          timeout=timeout)
  except subprocess.TimeoutExpired as error:
    record.update(status="crashed", detail=f"timeout after {timeout:.0f} s",
                  stderr_tail=(error.stderr or b"")[-3000:].decode("utf-8", "replace")
                  if isinstance(error.stderr, bytes) else (error.stderr or "")[-3000:])
    return record
  record["returncode"] = proc.returncode
  stderr = proc.stderr
  if proc.returncode == 0:
    record.update(status="accepted", detail="")
    warnings = [l for l in stderr.splitlines() if "WARNING" in l or "warning" in l.lower()]
    if warnings:
      record["warnings"] = warnings[:5]
    return record
  config_error = next((l for l in stderr.splitlines() if l.startswith("config error: ")), None)
  if proc.returncode == 2 and "Traceback (most recent call last)" not in stderr:
    line = config_error[len("config error: "):] if config_error else next(
        (l for l in stderr.splitlines() if l.strip()), "(no message)")
    record.update(status="refused", detail=line, cli_error=config_error is None)
    return record
  record.update(status="crashed", detail=f"exit {proc.returncode}: " + last_error_line(stderr),
                stderr_tail=stderr[-4000:])
  return record


def last_error_line(stderr: str) -> str:
  lines = [l for l in stderr.splitlines() if l.strip()]
  for l in reversed(lines):
    if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b", l):
      return l.strip()
  return lines[-1].strip() if lines else "(no output)"


def error_key(detail: str) -> str:
  """The key an error names: the text before its first ':', without the `=VALUE` rljax writes after the key (a
  value may hold ':' itself)."""
  m = re.match(r"\s*([^\s=:]+)(=|:)", detail)
  return m.group(1) if m else detail.split(":", 1)[0].strip()


# ----------------------------------------------------------------------------------------------------------------
# Setup: verl tree, tiny model, tiny parquet.
# ----------------------------------------------------------------------------------------------------------------
def git(*args) -> bytes:
  return subprocess.run(["git", "-C", VERL_GIT, *args], check=True, capture_output=True).stdout


def checkout(workdir: str) -> str:
  repo = os.path.join(workdir, "verl")
  if os.path.isdir(repo):
    shutil.rmtree(repo)
  os.makedirs(repo)
  data = git("archive", "--format=tar", "HEAD")
  with tarfile.open(fileobj=io.BytesIO(data)) as tar:
    tar.extractall(repo)
  return repo


def make_tiny_model_and_data(workdir: str) -> tuple[str, str, str]:
  """As tests/test_launch_line.py makes a model directory (config.json of a 1-layer llama, TINY) and
  tests/data/conftest.py a tokenizer and verl-format parquet rows; and a MiMo directory (TINY as MiMo's config.json
  writes it, with one multi-token prediction layer). Returns (llama dir, MiMo dir, parquet)."""
  sys.path.insert(0, RLJAX_ROOT)
  from tests.data.conftest import make_tokenizer, prompt_row, write_rows  # pylint: disable=import-outside-toplevel
  # TINY of tests/test_launch_line.py, read without importing that test module (it imports the suite's helpers)
  with open(os.path.join(RLJAX_ROOT, "tests", "test_launch_line.py")) as f:
    tree = ast.parse(f.read())
  TINY = next(ast.literal_eval(n.value) for n in tree.body
              if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "TINY" for t in n.targets))
  model_dir = os.path.join(workdir, "tiny-llama")
  os.makedirs(model_dir, exist_ok=True)
  tokenizer = make_tokenizer()
  tokenizer.save_pretrained(model_dir)
  config = dict(TINY, vocab_size=max(TINY["vocab_size"], -(-len(tokenizer) // 64) * 64))
  with open(os.path.join(model_dir, "config.json"), "w") as f:
    json.dump(config, f)
  mtp_dir = os.path.join(workdir, "tiny-mimo")
  os.makedirs(mtp_dir, exist_ok=True)
  tokenizer.save_pretrained(mtp_dir)
  with open(os.path.join(mtp_dir, "config.json"), "w") as f:
    json.dump(dict(config, model_type="mimo", architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1), f)
  parquet = write_rows(os.path.join(workdir, "data", "tiny.parquet"), [prompt_row(i, 3) for i in range(16)])
  return model_dir, mtp_dir, parquet


def launch_scripts() -> list[str]:
  names = git("ls-tree", "-r", "--name-only", "HEAD").decode().splitlines()
  out = []
  for name in names:
    if not (name.startswith("examples/") and name.endswith(".sh")):
      continue
    text = git("show", f"HEAD:{name}").decode("utf-8", "replace")
    if re.search(r"python3?\s+-m\s+" + re.escape(MAIN_MODULE) + r"\b", text):
      out.append(name)
  return out


# ----------------------------------------------------------------------------------------------------------------
# Report.
# ----------------------------------------------------------------------------------------------------------------
def report(records: list[dict], meta: dict) -> str:
  lines = []
  width = max(len(r["script"]) for r in records)
  lines.append(f"verl launch lines against rljax.train --dry_run  (verl {meta['verl_commit'][:12]}, "
               f"{len(records)} scripts, base for lines without --config-name: {meta['base']})")
  lines.append("")
  lines.append(f"{'script':<{width}}  {'status':<12} {'dev':>4}  detail")
  lines.append("-" * (width + 80))
  for r in records:
    detail = r.get("detail", "")
    if r["status"] == "refused":
      detail = detail.splitlines()[0] if detail else ""
    lines.append(f"{r['script']:<{width}}  {r['status']:<12} {str(r.get('devices', '')):>4}  {detail}")
  lines.append("")
  counts = collections.Counter(r["status"] for r in records)
  lines.append("SUMMARY: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in ("accepted", "refused", "unresolvable",
                                                                             "crashed")) + f" (of {len(records)})")
  lines.append("")
  lines.append("REFUSALS BY KEY (text before the first ':' of the error, less its =VALUE):")
  groups = collections.defaultdict(list)
  for r in records:
    if r["status"] == "refused":
      groups[error_key(r["detail"])].append(r)
  for key, rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
    lines.append(f"  [{len(rs)}] {key}")
    messages = collections.Counter(r["detail"] for r in rs)
    for message, n in messages.most_common():
      lines.append(f"      {n}x {message}")
    for r in rs:
      lines.append(f"        - {r['script']}")

  def section(title, status, details):
    lines.extend(["", f"{title}:"])
    for r in records:
      if r["status"] == status:
        lines.append(f"  {r['script']}: {r['detail']}")
        lines.extend(details(r))

  section("CRASHES", "crashed", lambda r: [f"      | {l}" for l in (r.get("stderr_tail") or "").splitlines()[-25:]])
  section("UNRESOLVABLE", "unresolvable", lambda r: [
      f"      probe with each unresolved value spelled UNRESOLVED (one a string cannot stand for at its default) -> "
      f"{r['probe']}"] if r.get("probe") else [])
  lines.append("")
  lines.append("NOTES (how a line was read):")
  for r in records:
    for note in r.get("notes", []):
      lines.append(f"  {r['script']}: {note}")
  lines.append("")
  lines.append("COMMANDS (cwd, XLA host devices, argv) of every line that ran:")
  for r in records:
    if "argv" in r:
      argv = " ".join(_quote(a) for a in r["argv"][1:])
      lines.append(f"  {r['script']}  [cwd={r['cwd']}, devices={r['devices']}, config={r.get('config')}]")
      lines.append(f"      python {argv}")
  return "\n".join(lines) + "\n"


def _quote(arg: str) -> str:
  import shlex  # pylint: disable=import-outside-toplevel
  return shlex.quote(arg)


def main():
  global VERL_GIT  # pylint: disable=global-statement
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--verl_git", default=VERL_GIT, help="verl's git directory (its HEAD's examples are read)")
  parser.add_argument("--out", default="/tmp/verl_lines_results.txt")
  parser.add_argument("--json", default=None, help="also write the records as JSON here")
  parser.add_argument("--workdir", default="/tmp/verl_lines_work")
  parser.add_argument("--jobs", type=int, default=1, help="dry runs at a time")
  parser.add_argument("--timeout", type=float, default=120)
  parser.add_argument("--only", action="append", default=[], help="scripts whose path contains this")
  parser.add_argument("--base", choices=("auto", "grpo", "ppo", "verl"), default="auto")
  parser.add_argument("--parse_only", action="store_true", help="print the extracted lines, run nothing")
  args = parser.parse_args()
  VERL_GIT = args.verl_git
  os.nice(19)
  os.makedirs(args.workdir, exist_ok=True)
  repo = checkout(args.workdir)
  home = os.path.join(args.workdir, "home")
  os.makedirs(home, exist_ok=True)
  model_dir, mtp_dir, parquet = make_tiny_model_and_data(args.workdir)
  ctx = {"repo": repo, "model_dir": model_dir, "mtp_model_dir": mtp_dir, "parquet": parquet, "base": args.base}
  scripts = [s for s in launch_scripts() if not args.only or any(o in s for o in args.only)]
  records = []
  for script in scripts:
    text = git("show", f"HEAD:{script}").decode("utf-8", "replace")
    records.append(plan(script, extract(script, text, repo, home), ctx))
  if args.parse_only:
    for r in records:
      print(f"== {r['script']}: {r['status']} {r.get('detail', '')} devices={r.get('devices')} "
            f"config={r.get('config')}")
      for note in r["notes"]:
        print(f"   note: {note}")
      for a in r.get("argv", [])[3:]:
        print(f"   {a}")
    return
  todo = [r for r in records if "argv" in r]
  done = 0
  with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
    futures = {pool.submit(execute, r, args.timeout): r for r in todo}
    for future in concurrent.futures.as_completed(futures):
      r = future.result()
      done += 1
      print(f"[{done}/{len(todo)}] {r['status']:<9} {r['script']}  {r.get('detail', '')[:150]}", flush=True)
  meta = {"verl_commit": git("rev-parse", "HEAD").decode().strip(), "base": args.base}
  text = report(records, meta)
  with open(args.out, "w") as f:
    f.write(text)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(records, f, indent=1)
  summary_start = text.index("SUMMARY:")
  print(text[summary_start:text.index("NOTES (how")])


if __name__ == "__main__":
  main()
