"""The rules a policy applies: argv-prefix command rules that ignore flag order, patterns, path
globs, and the three presets built from them."""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field, replace
from typing import Any

from runagent.errors import ConfigError, UsageError
from runagent.record import record

# Spellings of one flag: `rm -R`, `rm --recursive` and `rm -r` are one rule.
FLAG_ALIASES: Mapping[str, Mapping[str, str]] = {
    "rm": {"-R": "-r", "--recursive": "-r", "--force": "-f"},
    "cp": {
        "-R": "-r",
        "--recursive": "-r",
        "--force": "-f",
        "--symbolic-link": "-s",
        "--link": "-l",
        "--target-directory": "-t",
    },
    "chmod": {"--recursive": "-R"},
    "chown": {"--recursive": "-R"},
    "git": {"--force": "-f"},
    "ln": {"--symbolic": "-s", "--force": "-f", "--target-directory": "-t"},
    "sed": {"--in-place": "-i"},
}
# Commands whose options are long names after one dash (`find -delete`): never split into letters.
SINGLE_DASH_LONG = frozenset({"find"})


_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


@record
class Argv:
    """A command's literal words sorted out: its name, its operands in order, its flag set."""

    command: str
    operands: tuple[str, ...]
    flags: frozenset[str]

    @classmethod
    def of(cls, words: Sequence[str]) -> Argv:
        command = words[0].rsplit("/", 1)[-1]
        aliases = FLAG_ALIASES.get(command, {})
        operands: list[str] = []
        flags: set[str] = set()
        options_end = False
        for word in words[1:]:
            if options_end or not word.startswith("-") or word == "-":
                operands.append(word)
            elif word == "--":
                options_end = True
            elif word.startswith("--") or command in SINGLE_DASH_LONG:
                name = word.partition("=")[0]
                flags.add(aliases.get(name, name))
            else:
                # -rf is -r -f. A glued value (-n5, -mfix) splits into letters too: that can make
                # a deny or approval rule match when it need not, never miss when it should.
                flags.update(aliases.get("-" + c, "-" + c) for c in word[1:])
        return cls(command, tuple(operands), frozenset(flags))


@record
class CommandRule:
    """An argv prefix: `rm -r` matches `rm -fr x`, `rm -r -f x` and `/bin/rm --recursive x`."""

    text: str
    argv: Argv

    @classmethod
    def parse(cls, text: str) -> CommandRule:
        try:
            words = shlex.split(text)
        except ValueError as error:
            raise UsageError(f"Command rule {text!r} cannot be split: {error}.") from None
        if not words:
            raise UsageError("A command rule is empty; write one like 'git push'.")
        return cls(text, Argv.of(words))

    def restricts(self, argv: Argv) -> bool:
        """For a deny or approval rule: its operands appear in order among the command's (so
        `git -C dir push` is `git push`), its flags among the command's."""
        if argv.command != self.argv.command or not self.argv.flags <= argv.flags:
            return False
        remaining = iter(argv.operands)
        return all(word in remaining for word in self.argv.operands)

    def permits(self, argv: Argv) -> bool:
        """For an allow rule: its operands start the command's, so extra words never widen it
        (`git status` allows `git status -s`, not `git -C x push status`)."""
        mine = self.argv
        return (
            argv.command == mine.command
            and mine.flags <= argv.flags
            and argv.operands[: len(mine.operands)] == mine.operands
        )


@record
class Rules:
    """Everything a policy decides by; built by a preset or `Rules.from_mapping`."""

    deny: tuple[CommandRule, ...] = ()
    approve: tuple[CommandRule, ...] = ()
    # None: any command no rule names is allowed; a tuple: only these are, others need approval.
    allow: tuple[CommandRule, ...] | None = None
    deny_patterns: tuple[str, ...] = ()  # regular expressions over a command's words, spaced
    approve_patterns: tuple[str, ...] = ()
    protected_paths: tuple[str, ...] = ()  # globs: writes there are denied
    private_paths: tuple[str, ...] = ()  # globs: reads there need approval
    read_only: bool = False  # every write needs approval
    # Globs outside the workspace that a redirection may write without asking.
    writable_outside: tuple[str, ...] = (
        "/dev/null",
        "/dev/stdout",
        "/dev/stderr",
        "/dev/tty",
        "/dev/fd/*",
    )
    # Setting these changes what later commands are or do (`PATH=/tmp/bad:$PATH cat`), whether
    # written in the command or sent in a shell operation's `env`.
    sensitive_variables: frozenset[str] = field(
        default_factory=lambda: _names(
            "PATH ENV PROMPT_COMMAND IFS SHELLOPTS BASHOPTS CDPATH PS4 HOME ZDOTDIR INPUTRC "
            "SHELL TMPDIR PAGER EDITOR VISUAL BROWSER MANPAGER TERMINFO LOCPATH NLSPATH "
            "HOSTALIASES CLASSPATH TCLLIBPATH CC CXX CPP LD AR CFLAGS CXXFLAGS LDFLAGS MAKEFLAGS "
            "GOFLAGS RUSTFLAGS SUDO_ASKPASS SSH_ASKPASS GCONV_PATH GLIBC_TUNABLES"
        )
    )
    # ... and every variable of these families: the loader's, the shell's exported functions
    # (BASH_FUNC_f%%), git's, and the search paths and start-up options of interpreters.
    sensitive_prefixes: tuple[str, ...] = (
        "LD_", "DYLD_", "BASH_", "GIT_", "PYTHON", "PERL", "RUBY", "NODE_", "NPM_CONFIG_",
        "npm_config_", "LUA_", "JAVA_", "_JAVA_", "JDK_", "GEM_", "BUNDLE_", "PIP_", "UV_",
        "CARGO_", "RUSTC", "XDG_", "SSH_", "LESS", "OPENSSL_", "MALLOC_", "DOTNET_", "PHP",
    )  # fmt: skip

    def sensitive(self, name: str) -> bool:
        """Whether setting `name` can change what runs or what it loads; a name the shell could
        not assign (`BASH_FUNC_f%%`, `a-b`) counts, since only exec can pass it."""
        return (
            name in self.sensitive_variables
            or name.startswith(self.sensitive_prefixes)
            or _VARIABLE.fullmatch(name) is None
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], base: Rules | None = None) -> Rules:
        """Rules from config data, added to `base` (a preset's). Keys, all optional:

        deny, approve, allow: lists of argv prefixes ("git push"); `allow` turns on (or widens)
          an allowlist: commands it does not name then need approval.
        deny_patterns, approve_patterns: lists of regular expressions over a command's words.
        protected_paths, private_paths, writable_outside: lists of globs (`**` spans folders;
          a glob with no `/` matches a name in any folder).
        read_only: true or false.
        """
        base = base or cls()
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise ConfigError(
                f"ops.rules.{unknown[0]} is not a policy rule; "
                f"use one of {', '.join(sorted(_KEYS))}."
            )
        changes: dict[str, Any] = {}
        for key in ("deny", "approve", "allow"):
            if key in data:
                rules = tuple(CommandRule.parse(t) for t in _strings(key, data[key]))
                changes[key] = (getattr(base, key) or ()) + rules
        for key in ("deny_patterns", "approve_patterns"):
            if key in data:
                patterns = _strings(key, data[key])
                for pattern in patterns:
                    try:
                        re.compile(pattern)
                    except re.error as error:
                        raise ConfigError(
                            f"ops.rules.{key}: {pattern!r} is not a regular expression ({error})."
                        ) from None
                changes[key] = getattr(base, key) + patterns
        for key in ("protected_paths", "private_paths", "writable_outside"):
            if key in data:
                changes[key] = getattr(base, key) + _strings(key, data[key])
        if "read_only" in data:
            if not isinstance(data["read_only"], bool):
                raise ConfigError(
                    f"ops.rules.read_only is {data['read_only']!r}; use true or false."
                )
            changes["read_only"] = data["read_only"]
        return replace(base, **changes)


_KEYS = _names(
    "deny approve allow deny_patterns approve_patterns protected_paths private_paths "
    "writable_outside read_only"
)


def _strings(key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f"ops.rules.{key} is {value!r}; use a list of strings.")
    items = tuple(value)
    if not all(isinstance(item, str) for item in items):
        raise ConfigError(f"ops.rules.{key} holds {items!r}; use a list of strings.")
    return items


@functools.cache
def pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


@functools.cache
def glob(text: str) -> re.Pattern[str]:
    """A path glob as a regular expression: `**` spans folders, `*` and `?` stay in one, `dir/**`
    matches the folder itself too, and a glob with no `/` matches a name in any folder."""
    anchored = "/" in text.rstrip("/")
    body = ""
    index = 0
    while index < len(text):
        if text.startswith("/**", index) and index + 3 == len(text):
            body += "(/.*)?"
            index += 3
        elif text.startswith("**/", index):
            body += "(.*/)?"
            index += 3
        elif text.startswith("**", index):
            body += ".*"
            index += 2
        elif text[index] == "*":
            body += "[^/]*"
            index += 1
        elif text[index] == "?":
            body += "[^/]"
            index += 1
        else:
            body += re.escape(text[index])
            index += 1
    return re.compile(body if anchored else f"(.*/)?{body}", re.DOTALL)


def _rules(*texts: str) -> tuple[CommandRule, ...]:
    return tuple(CommandRule.parse(t) for t in texts)


_ROOTS = ("/", "/*", "~", "~/", "~/*", "/home", "/etc", "/usr", "/var", "/boot")
_DESTROY_PATTERNS = (
    r"^mkfs(\.\w+)? ",
    r"^dd .*\bof=/dev/",
    r"^(chmod|chown) (-\S+ )*-R\S* (\S+ )?/$",
    r"^(shutdown|reboot|halt|poweroff)\b",
)
_DESTRUCTIVE = (
    "rm -r",
    "git push",
    "git reset --hard",
    "git clean -f",
    "git checkout -f",
    "git branch -D",
    "git stash drop",
    "git stash clear",
    "find -delete",
    "chmod -R",
    "chown -R",
    "shred",
    "dd",
    "truncate",
    "crontab",
    "pkill",
    "killall",
)
_READ_ONLY_TOOLS = sorted(
    _names(
        # No awk, less or yq: they can run commands or write files (system(), !cmd, -i).
        "ls cat head tail wc grep egrep fgrep rg find pwd echo printf true false test [ stat file "
        "du df tree sort uniq cut tr diff cmp basename dirname realpath readlink which type date "
        "whoami id uname nl column jq od md5sum sha1sum sha256sum"
    )
)
_RESTRICTIVE_APPROVE = (
    "find -exec",
    "find -execdir",
    "find -ok",
    "find -fprint",
    "find -fprintf",
    "find -fls",
    "rg --pre",
    "git -c",
    "git --output",
    "git --ext-diff",
    "git --textconv",
    "sort -o",
    "sort --output",
    "tree -o",
)
# .env.example and its kin are meant to be shared: only the files that hold values are guarded.
_ENV_FILES = (".env", ".env.local", ".env.*.local")
_PROTECTED = (".git/**", "**/.git/**", *_ENV_FILES)
_PRIVATE = (*_ENV_FILES, "*.pem", "*.key", "id_rsa*", "id_ed25519*", ".netrc", ".npmrc")


# A git alias renames or runs anything (`git -c alias.p=push p`, `alias.x=!sh`), and core.*
# keys name programs git starts (pager, sshCommand, hooksPath, fsmonitor).
_GIT_INDIRECTION = (
    r"(?i)^git (\S+ )*(-c|--config-env)[ =]?(alias|core)\.",
    r"(?i)^git (\S+ )*config (\S+ )*(alias|core)\.",
)


def _standard() -> Rules:
    return Rules(
        deny=_rules("sudo", "su", "doas", "pkexec", *(f"rm -r {root}" for root in _ROOTS)),
        approve=_rules(*_DESTRUCTIVE),
        approve_patterns=_GIT_INDIRECTION,
        deny_patterns=_DESTROY_PATTERNS,
        protected_paths=_PROTECTED,
        private_paths=_PRIVATE,
    )


def _restrictive() -> Rules:
    standard = _standard()
    allow = (
        *_READ_ONLY_TOOLS,
        "git status",
        "git log",
        "git diff",
        "git show",
        "git rev-parse",
        "git ls-files",
        "git blame",
    )
    return replace(
        standard,
        approve=standard.approve + _rules(*_RESTRICTIVE_APPROVE),
        allow=_rules(*allow),
        read_only=True,
    )


def _permissive() -> Rules:
    return Rules(
        deny=_rules(*(f"rm -r {root}" for root in _ROOTS)),
        approve=_rules("sudo", "su", "doas", "pkexec", "rm -r", "git push -f", "git reset --hard"),
        deny_patterns=_DESTROY_PATTERNS,
        protected_paths=(".git/**", "**/.git/**"),
        writable_outside=(*Rules().writable_outside, "/tmp/**"),
    )


PRESETS = {"restrictive": _restrictive, "standard": _standard, "permissive": _permissive}
DEFAULT_PRESET = "standard"


def preset(name: str) -> Rules:
    """The rules of a preset by name; a UsageError that names the value for any other."""
    build = PRESETS.get(name)
    if build is None:
        raise UsageError(f"Policy preset {name!r} does not exist; use one of {', '.join(PRESETS)}.")
    return build()
