"""Tests of backends/ (see tests/conftest.py for the fixtures)."""
