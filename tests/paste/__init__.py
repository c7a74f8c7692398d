"""Tests of paste/ (see tests/conftest.py for the fixtures)."""
