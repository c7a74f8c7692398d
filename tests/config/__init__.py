"""Tests of config/ (see tests/conftest.py for the fixtures)."""
