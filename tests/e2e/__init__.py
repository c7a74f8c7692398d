"""Tests of e2e/ (see tests/conftest.py for the fixtures)."""
