"""The `xai` backend: xAI's (Grok) chat-completions API."""

from __future__ import annotations

import sys

from backends.chat_completions import ChatBackend, main


class XaiBackend(ChatBackend):
    name = "xai"
    token_variable = "XAI_API_KEY"
    default_url = "https://api.x.ai/v1/chat/completions"
    default_model = "grok-4"


if __name__ == "__main__":
    sys.exit(main(XaiBackend.token_variable, cite=False))
