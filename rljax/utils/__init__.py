"""Pure-Python helpers below every other package: loading user code (`user_code`) and arithmetic on literals
without `eval` (`safe_arith`). They import nothing else from rljax."""
