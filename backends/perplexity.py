"""The `perplexity` backend: Perplexity's chat-completions API, with its citations as Sources."""

from __future__ import annotations

import sys

from backends.chat_completions import ChatBackend, main


class PerplexityBackend(ChatBackend):
    name = "perplexity"
    token_variable = "PERPLEXITY_API_KEY"
    default_url = "https://api.perplexity.ai/chat/completions"
    default_model = "sonar-pro"


if __name__ == "__main__":
    sys.exit(main(PerplexityBackend.token_variable, cite=True))
