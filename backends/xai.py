"""The `xai` backend: xAI's (Grok) chat-completions API."""

from __future__ import annotations

import sys

from backends.chat_completions import ChatBackend, main
from runagent.backend import Backend
from runagent.config import AgentConfig


class XaiBackend(ChatBackend):
    name = "xai"
    env_prefixes = ("XAI_",)
    token_variable = "XAI_API_KEY"
    default_url = "https://api.x.ai/v1/chat/completions"
    default_model = "grok-4"


def create(config: AgentConfig) -> Backend:
    return XaiBackend(config)


if __name__ == "__main__":
    sys.exit(main(XaiBackend.token_variable, cite=False))
