"""Helpers shared by test modules: no test module imports another (tests/conftest.py and the
fixture modules beside it hold the shared fixtures)."""
