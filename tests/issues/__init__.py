"""Tests of issues/ (see tests/conftest.py for the fixtures)."""
