"""Tests of executors/ (see tests/conftest.py for the fixtures)."""
