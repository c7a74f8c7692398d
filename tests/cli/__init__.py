"""Tests of cli/ (see tests/conftest.py for the fixtures)."""
