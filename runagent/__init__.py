"""run-agent: a supervised run-folder loop runner for AI coding agents."""

__version__ = "0.1.0"
