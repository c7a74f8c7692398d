"""Tests of server/ (see tests/conftest.py for the fixtures)."""
