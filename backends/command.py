"""The `command` backend: runs any executable from config, the way custom agents plug in.

`command: [argv...]` (plus `args`) may use the placeholders {prompt_file}, {prompt},
{run_folder}, {task_folder} and {model}, and, as any agent's command may, {config_dir} (the
folder of config.yaml, put in when the config is read). The prompt goes to stdin unless a
placeholder takes it.
"""

from __future__ import annotations

import re

from runagent.backend import AgentConfig, Backend, ConfigError, LaunchSpec, RunContext

PROMPT_PLACEHOLDERS = ("{prompt_file}", "{prompt}")
PLACEHOLDER = re.compile(r"\{(?:prompt_file|prompt|run_folder|task_folder|model)\}")


class CommandBackend(Backend):
    name = "command"

    def __init__(self, config: AgentConfig) -> None:
        super().__init__(config)
        if not config.command:
            raise ConfigError(
                f"agents.{config.name}.command is not set; give the agent's command line as a "
                "list, e.g. command: [python3, my_agent.py, '{prompt_file}']"
            )

    def launch(self, ctx: RunContext) -> LaunchSpec:
        values = {
            "{prompt_file}": str(ctx.prompt_file),
            "{prompt}": ctx.prompt,
            "{run_folder}": str(ctx.run_folder),
            "{task_folder}": str(ctx.task_folder),
            "{model}": self.config.model or "",
        }
        words = [*self.config.command, *self.config.args]
        # One pass: a value put in (the prompt, a folder's name) is never read for placeholders.
        argv = [PLACEHOLDER.sub(lambda m: values[m.group(0)], word) for word in words]
        takes_prompt = any(p in w for w in words for p in PROMPT_PLACEHOLDERS)
        env = self.environment(ctx)
        if self.config.model:
            env.setdefault("RUN_AGENT_MODEL", self.config.model)
        return LaunchSpec(
            argv=tuple(argv),
            env=env,
            cwd=ctx.working_dir,
            stdin=None if takes_prompt else ctx.prompt_file,
        )
