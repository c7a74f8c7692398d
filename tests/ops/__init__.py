"""Tests of ops/ (see tests/conftest.py for the fixtures)."""
