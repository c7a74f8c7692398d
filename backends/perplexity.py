"""The `perplexity` backend: Perplexity's chat-completions API, with its citations as Sources."""

from __future__ import annotations

import sys

from backends.chat_completions import ChatBackend, main
from runagent.backend import Backend
from runagent.config import AgentConfig


class PerplexityBackend(ChatBackend):
    name = "perplexity"
    env_prefixes = ("PERPLEXITY_",)
    token_variable = "PERPLEXITY_API_KEY"
    default_url = "https://api.perplexity.ai/chat/completions"
    default_model = "sonar-pro"


def create(config: AgentConfig) -> Backend:
    return PerplexityBackend(config)


if __name__ == "__main__":
    sys.exit(main(PerplexityBackend.token_variable, cite=True))
