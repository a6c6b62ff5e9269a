"""Fuzz harnesses of the C extensions against their Python/numpy references (README in
`_common`): each `test_fuzz_*.py` is a pytest replay of seeded inputs and an atheris
entry point (`python -m tests.fuzz.test_fuzz_cwrite -max_total_time=10`)."""
