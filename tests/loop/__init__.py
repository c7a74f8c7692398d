"""Tests of loop/ (see tests/conftest.py for the fixtures)."""
