"""Tests of store/ (see tests/conftest.py for the fixtures)."""
