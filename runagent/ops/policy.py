"""The policy gate: whether a shell command or a file operation may run, needs approval, or is
denied, and which rule said so."""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Mapping
from dataclasses import field

from runagent.errors import ConfigError
from runagent.ops import inlinecode
from runagent.ops import rules as rulebook
from runagent.ops.rules import Argv, CommandRule, Rules
from runagent.ops.shellsyntax import Assignment, Redirect, SimpleCommand, Stdin, Word, parse
from runagent.ops.wrapper import PRIVILEGED, SHELLS, unwrap
from runagent.record import record

# `bash -c "bash -c '...'"` nests; past this depth the command is not worth reading.
MAX_DEPTH = 8
# A word nobody knows until the command runs: it equals no rule word and is never a flag.
_COMPUTED = "\0"
# Commands whose operands are files they change: every operand, or the last (a destination).
# Redirections are judged apart; these are the common ways to write without one.
_WRITES_EVERY_OPERAND = frozenset(
    {"tee", "touch", "mkdir", "rm", "rmdir", "unlink", "truncate", "shred", "mv", "chmod", "chown",
     "chgrp", "mkfifo"}
)  # fmt: skip
_WRITES_LAST_OPERAND = frozenset({"cp", "ln", "install", "rsync"})
# Options whose value is a file or folder the command writes: `curl -o F`, `sort --output=F`.
_WRITE_OPTIONS: Mapping[str, frozenset[str]] = {
    name: frozenset(options.split())
    for name, options in {
        "sort": "-o --output",
        "curl": "-o --output --output-dir -c --cookie-jar -D --dump-header",
        "wget": "-O --output-document -P --directory-prefix -o --output-file -a --append-output",
        "tar": "-C --directory",
        "unzip": "-d",
        "patch": "-o --output",
        "find": "-fprint -fprint0 -fprintf -fls",
        "cp": "-t --target-directory",
        "mv": "-t --target-directory",
        "ln": "-t --target-directory",
        "install": "-t --target-directory",
        "git": "-C",
        "make": "-C --directory",
        "gcc": "-o",
        "cc": "-o",
        "clang": "-o",
    }.items()
}
# cp -s and cp -l make links as ln does.
_CP_LINKS = frozenset({"-s", "-l"})
_WRITES_IN_PLACE = frozenset({"sed", "perl"})  # with -i: every operand
_STDIN_FILES = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})


class Verdict(enum.StrEnum):
    """What the gate says; the order of strictness is deny, then approve, then allow."""

    ALLOW = "allow"
    APPROVE = "approve"
    DENY = "deny"


_RANK = {Verdict.ALLOW: 0, Verdict.APPROVE: 1, Verdict.DENY: 2}


class FileOperation(enum.StrEnum):
    """The protocol's file operations; all but readFile change the workspace."""

    CREATE = "createFile"
    READ = "readFile"
    EDIT = "editFile"
    DELETE = "deleteFile"


@record
class Decision:
    """A verdict, the rule that fired (e.g. `shell.approvalRequired: git push`), why, and for a
    denial what to do instead."""

    verdict: Verdict
    rule: str
    reason: str
    suggestion: str | None = None


@record
class Policy:
    """A named set of rules; `check_command` and `check_path` are the one gate every operation
    passes. Paths are judged by their text: symbolic links are the workspace sandbox's to refuse."""

    name: str = rulebook.DEFAULT_PRESET
    rules: Rules = field(default_factory=lambda: rulebook.preset(rulebook.DEFAULT_PRESET))

    @classmethod
    def preset(cls, name: str) -> Policy:
        """`restrictive` (read-only, an allowlist of reading tools), `standard` (the default) or
        `permissive`; a UsageError naming the value for any other."""
        return cls(name, rulebook.preset(name))

    @classmethod
    def from_config(cls, data: Mapping[str, object]) -> Policy:
        """A policy from the `ops` section of a config:

            ops:
              policy: standard          # the preset to start from (the default: standard)
              rules:                    # optional, added to the preset's; see Rules.from_mapping
                deny: ["terraform destroy"]
                approve: ["npm publish"]
                allow: ["ls", "git status"]   # an allowlist: anything else needs approval
                deny_patterns: ["^curl .*--upload-file"]
                protected_paths: ["secrets/**"]
                private_paths: ["*.sqlite"]
                writable_outside: ["/tmp/**"]
                read_only: false

        Other keys of the section belong to the rest of the runtime and are ignored here.
        """
        name = data.get("policy", rulebook.DEFAULT_PRESET)
        if not isinstance(name, str):
            raise ConfigError(f"ops.policy is {name!r}; use one of {', '.join(rulebook.PRESETS)}.")
        if name not in rulebook.PRESETS:
            raise ConfigError(
                f"ops.policy {name!r} is not a preset; use one of {', '.join(rulebook.PRESETS)}."
            )
        extra = data.get("rules") or {}
        if not isinstance(extra, Mapping):
            raise ConfigError(f"ops.rules is {extra!r}; use a mapping such as {{deny: [sudo]}}.")
        return cls(name, Rules.from_mapping(extra, rulebook.preset(name)))

    def check_command(self, command: str, env: Mapping[str, str] | None = None) -> Decision:
        """The decision on a shell command run with the variables `env` (a shell operation's own,
        judged as the same assignments written before the command would be): every simple
        command in it is judged, and the strictest verdict wins. What cannot be read needs
        approval; it is never allowed."""
        judgement = _Judgement(self.rules)
        for name, value in (env or {}).items():
            judgement.assignment(Assignment(name, value), "the operation's env")
        judgement.script(command, 0)
        return judgement.decision(command)

    def check_path(self, operation: str, path: str) -> Decision:
        """The decision on a file operation (createFile, readFile, editFile, deleteFile) on
        `path`, relative to the workspace."""
        try:
            kind = FileOperation(operation)
        except ValueError:
            return Decision(
                Verdict.DENY,
                "file.unknownOperation",
                f"{operation!r} is not a file operation",
                f"Use one of {', '.join(FileOperation)}.",
            )
        inside = _inside(".", path) if "\0" not in path else None
        if inside is None or inside == ".":
            return Decision(
                Verdict.DENY,
                "file.outsideWorkspace",
                f"{path!r} is not a file inside the workspace",
                "Use a path relative to the workspace, without '..' or a leading '/'.",
            )
        write = kind is not FileOperation.READ
        return _file_decision(self.rules, inside, write=write, origin=kind)


def _inside(cwd: str, path: str) -> str | None:
    """`path` relative to the workspace root, or None when it leads out of it (lexically)."""
    if path.startswith(("/", "~")) or not path:
        return None
    joined = posixpath.normpath(posixpath.join(cwd, path))
    return None if joined == ".." or joined.startswith("../") else joined


def _matching(globs: tuple[str, ...], path: str) -> str | None:
    return next((g for g in globs if rulebook.glob(g).fullmatch(path)), None)


def _file_decision(rules: Rules, path: str, *, write: bool, origin: str) -> Decision:
    if write:
        protected = _matching(rules.protected_paths, path)
        if protected is not None:
            return Decision(
                Verdict.DENY,
                f"file.protected: {protected}",
                f"{origin} would change {path!r}, which the policy protects ({protected})",
                f"Leave {path} as it is; if it must change, ask the user to change it.",
            )
        if rules.read_only:
            return Decision(
                Verdict.APPROVE,
                "file.readOnly",
                f"{origin} would change {path!r} and the policy is read-only",
            )
    else:
        private = _matching(rules.private_paths, path)
        if private is not None:
            return Decision(
                Verdict.APPROVE,
                f"file.private: {private}",
                f"{path!r} may hold secrets ({private})",
            )
    return Decision(Verdict.ALLOW, "file.allowed", f"{origin} on {path!r} is within the workspace")


class _Judgement:
    """The decisions on each part of one command line, in the order the shell meets them."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.decisions: list[Decision] = []
        self.commands = 0
        # The shell's folder relative to the workspace; None once a `cd` makes it unknown.
        self.cwd: str | None = "."

    def decision(self, command: str) -> Decision:
        if not self.decisions:
            if self.commands == 0 and not command.strip():
                return Decision(Verdict.DENY, "shell.empty", "the command is empty", "Send one.")
            scope = "on the allowlist" if self.rules.allow is not None else "stopped by no rule"
            return Decision(Verdict.ALLOW, "shell.allowed", f"every command in it is {scope}")
        return max(self.decisions, key=lambda d: _RANK[d.verdict])

    def approve(self, rule: str, reason: str) -> None:
        self.decisions.append(Decision(Verdict.APPROVE, rule, reason))

    def script(self, text: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.approve("shell.nested", f"shells nest more than {MAX_DEPTH} deep")
            return
        parsed = parse(text)
        for problem in parsed.problems:
            self.approve("shell.unparsed", f"{problem}, so what it runs is not known")
        for step in parsed.steps:
            if isinstance(step, Redirect):
                self.redirect(step)
            elif isinstance(step, Assignment):
                self.assignment(step)
            else:
                self.command(step.words, step, depth)

    def assignment(self, step: Assignment, origin: str = "the command") -> None:
        if self.rules.sensitive(step.name):
            self.approve(
                f"shell.sensitiveVariable: {step.name}",
                f"{origin} sets {step.name}, which can change what commands run or load",
            )

    def redirect(self, step: Redirect) -> None:
        if not step.writes:
            if step.target is not None:
                self.read(step.target, f"'{step.operator}'")
            return
        if step.target is None:
            self.approve("shell.computedRedirect", "a redirection writes to a computed file name")
            return
        self.write(step.target, f"'{step.operator}'")

    def write(self, target: str, origin: str) -> None:
        """Judge a file the command line writes, named as the shell sees it."""
        if target == _COMPUTED:
            self.approve("shell.computedWrite", f"{origin} writes a file only known at run time")
            return
        if _matching(self.rules.writable_outside, target) is not None:
            return
        inside = _inside(self.cwd, target) if self.cwd is not None else None
        if inside is None:
            where = "outside the workspace" if self.cwd is not None else "after a cd elsewhere"
            self.approve("shell.writeOutsideWorkspace", f"{origin} writes {target!r}, {where}")
            return
        decision = _file_decision(self.rules, inside, write=True, origin=origin)
        if decision.verdict is not Verdict.ALLOW:
            self.decisions.append(decision)

    def command(self, words: tuple[Word, ...], step: SimpleCommand, depth: int) -> None:
        if not words:
            return
        self.commands += 1
        name = words[0]
        if name is None:
            self.approve("shell.computedCommand", "the command's name is only known at run time")
            return
        base = name.rsplit("/", 1)[-1]
        if base == "eval":
            if None in words[1:]:
                self.approve("shell.eval", "eval runs text that is only known at run time")
            else:
                self.script(" ".join(w for w in words[1:] if w is not None), depth + 1)
            return
        if base in ("cd", "pushd", "popd"):
            self.change_directory(words)
        if base in (".", "source"):
            self.source(words, step)
        unwrapped = unwrap(base, words)
        if unwrapped is None:
            self.match(words)
            self.interpreter(base, words, step, depth)
            self.program(base, words)
            return
        if unwrapped.problem is not None:
            self.approve("shell.wrapper", f"{unwrapped.problem}, so what it runs is not known")
        if unwrapped.moves:
            self.cwd = None
        # An allowlist names what runs: `timeout 5 ls` and `bash -c 'ls'` run ls. The wrappers
        # that change who runs it (sudo, su, chroot) are not transparent.
        runs = bool(unwrapped.commands or unwrapped.scripts)
        self.match(unwrapped.own, transparent=runs and base not in PRIVILEGED)
        for assignment in unwrapped.assignments:
            self.assignment(assignment)
        for script in unwrapped.scripts:
            if script is None:
                self.approve(
                    "shell.computedScript", f"`{base}` runs a script only known at run time"
                )
            else:
                self.script(script, depth + 1)
        placeholder = _xargs_placeholder(unwrapped.own) if unwrapped.appends else None
        for inner in unwrapped.commands:
            # xargs adds words it reads from its input (or puts them in place of -I's string):
            # nobody knows them yet.
            if placeholder is not None:
                inner = tuple(None if w is None or placeholder in w else w for w in inner)
            argv = inner + ((None,) if unwrapped.appends else ())
            self.command(argv, step, depth + 1)
        if base in SHELLS and not unwrapped.scripts:
            self.interpreter(base, words, step, depth)

    def source(self, words: tuple[Word, ...], step: SimpleCommand) -> None:
        """`. file` runs a file in this shell: like `bash file`, unless the file is a stream."""
        target = words[1] if len(words) > 1 else ""
        if target is None:
            self.approve("shell.computedScript", "`source` runs a file only known at run time")
        elif target in _STDIN_FILES and step.stdin in (Stdin.PIPE, Stdin.COMPUTED):
            self.approve(
                "shell.pipeToShell", "`source` runs its input as a program nobody has read"
            )

    def operands(self, argv: Argv, words: tuple[Word, ...]) -> None:
        """The files a command's operands and options name: the ones it writes (one only known
        at run time needs approval), the links it makes, the private ones it reads."""
        origin = f"`{argv.command}`"
        every = argv.command in _WRITES_EVERY_OPERAND or (
            argv.command in _WRITES_IN_PLACE and "-i" in argv.flags
        )
        if every or argv.command in _WRITES_LAST_OPERAND:
            # cp -t DIR puts the destination first: then every operand counts.
            every = every or "-t" in argv.flags
            targets = argv.operands if every else argv.operands[-1:]
            for target in targets:
                if every or len(argv.operands) > 1:
                    self.write(target, origin)
        for value in _option_values(argv.command, words, _WRITE_OPTIONS.get(argv.command)):
            self.write(_COMPUTED if value is None else value, f"{origin} {value or ''}".strip())
        if argv.command == "ln" or (argv.command == "cp" and argv.flags & _CP_LINKS):
            self.links(argv)
        for operand in argv.operands:
            self.read(operand, origin)

    def links(self, argv: Argv) -> None:
        """A link to a file outside the workspace lets a later write inside reach it
        (`ln -s /elsewhere l && touch l/x`): a link must point inside, and be known."""
        operands = argv.operands
        targets = operands if "-t" in argv.flags or len(operands) == 1 else operands[:-1]
        where = "." if "-t" in argv.flags or len(operands) == 1 else operands[-1]
        symbolic = "-s" in argv.flags
        for target in targets:
            if target == _COMPUTED:
                self.approve(
                    "shell.computedLink", f"`{argv.command}` links to a file only known at run time"
                )
                continue
            if _matching(self.rules.writable_outside, target) is not None:
                continue
            # A relative symbolic link is read from the link's folder (or from the link named
            # when that is a folder): from either, it must stay inside. A hard link's is ours.
            relative = symbolic and not target.startswith(("/", "~"))
            folders = (posixpath.dirname(where) or ".", where) if relative else (".",)
            if self.cwd is None or any(
                folder == _COMPUTED or _inside(self.cwd, posixpath.join(folder, target)) is None
                for folder in folders
            ):
                self.approve(
                    "shell.linkOutsideWorkspace",
                    f"`{argv.command}` makes a link to {target!r}, outside the workspace",
                )

    def read(self, target: str, origin: str) -> None:
        inside = _inside(self.cwd, target) if self.cwd is not None else None
        if inside is not None and self.rules.private_paths:
            decision = _file_decision(self.rules, inside, write=False, origin=origin)
            if decision.verdict is not Verdict.ALLOW:
                self.decisions.append(decision)

    def change_directory(self, words: tuple[Word, ...]) -> None:
        target = words[1] if len(words) > 1 and words[0] != "popd" else None
        if target is not None and not target.startswith("-") and self.cwd is not None:
            self.cwd = _inside(self.cwd, target)
        else:
            self.cwd = None

    def interpreter(
        self, base: str, words: tuple[Word, ...], step: SimpleCommand, depth: int
    ) -> None:
        """A shell or interpreter given its program in its words or on stdin. A shell's program
        is judged if its text is known (a heredoc into bash); another language's cannot be
        (what `open('/elsewhere/x', 'w')` writes is only known when it runs), so it needs
        approval; and any program coming down a pipe needs approval."""
        language = inlinecode.interpreter(base)
        if base not in SHELLS and language is None:
            return
        operands = [w for w in words[1:] if w is None or not w.startswith("-") or w == "-"]
        if operands[:1] == [None]:  # python3 <(curl x)
            self.approve("shell.computedScript", f"`{base}` runs code only known at run time")
            return
        if language is not None and inlinecode.has_inline_code(
            inlinecode.LANGUAGES[language], words
        ):
            self.approve(
                "shell.inlineCode",
                f"`{base}` runs code given inline; what it writes is only known at run time",
            )
            return
        operands = ["-" if w in _STDIN_FILES else w for w in operands]
        # sh -s reads the program from stdin even when operands follow (they become $1...).
        from_stdin = base in SHELLS and any(
            w is not None and w[:1] == "-" and w[1:2] != "-" and "s" in w[1:] for w in words[1:]
        )
        if not from_stdin and operands and operands != ["-"]:
            return
        if step.stdin is Stdin.TEXT and base in SHELLS and step.stdin_text is not None:
            self.script(step.stdin_text, depth + 1)
        elif step.stdin is Stdin.TEXT:
            self.approve(
                "shell.inlineCode",
                f"`{base}` runs code from a heredoc; what it writes is only known at run time",
            )
        elif step.stdin in (Stdin.PIPE, Stdin.COMPUTED):
            source = next((w for w in step.upstream if w in ("curl", "wget", "fetch")), None)
            what = f"a download ({source})" if source else "its input"
            self.approve(
                "shell.pipeToShell",
                f"`{base}` runs {what} as a program nobody has read",
            )

    def program(self, base: str, words: tuple[Word, ...]) -> None:
        """awk and sed: their programs are read, since most only filter text; one that writes
        files or runs commands needs approval."""
        why = None
        if base in inlinecode.AWKS:
            why = inlinecode.awk_acts(words)
        elif base == "sed":
            why = inlinecode.sed_acts(words)
        if why is not None:
            self.approve("shell.inlineCode", f"`{base}`: {why}")

    def match(self, words: tuple[Word, ...], *, transparent: bool = False) -> None:
        literal = [_COMPUTED if w is None else w for w in words]
        if literal[0] == _COMPUTED:
            return
        argv = Argv.of(literal)
        shown = " ".join("$?" if w is None else w for w in words)
        # Patterns see the command by its name, so /sbin/mkfs is mkfs.
        joined = " ".join([argv.command, *("$?" if w is None else w for w in words[1:])])
        fired = len(self.decisions)
        for rule in self.rules.deny:
            if rule.restricts(argv):
                self.decisions.append(_denial(rule, shown))
        for text in self.rules.deny_patterns:
            if rulebook.pattern(text).search(joined):
                self.decisions.append(
                    Decision(
                        Verdict.DENY,
                        f"shell.blockedPattern: {text}",
                        f"{shown!r} matches the blocked pattern {text!r}",
                        "Leave this command out; if the task needs it, ask the user to run it.",
                    )
                )
        for rule in self.rules.approve:
            if rule.restricts(argv):
                self.approve(
                    f"shell.approvalRequired: {rule.text}",
                    f"{shown!r} matches {rule.text!r}, which needs approval",
                )
        for text in self.rules.approve_patterns:
            if rulebook.pattern(text).search(joined):
                self.approve(f"shell.approvalPattern: {text}", f"{shown!r} matches {text!r}")
        ruled = any(r.argv.command == argv.command for r in self.rules.deny + self.rules.approve)
        if None in words and ruled and len(self.decisions) == fired:
            self.approve(
                "shell.computedArguments",
                f"rules apply to `{argv.command}` and some of its words are only known at run time",
            )
        self.operands(argv, words)
        allow = self.rules.allow
        if allow is not None and not transparent and not any(r.permits(argv) for r in allow):
            self.approve("shell.notAllowed", f"`{argv.command}` is not on the allowlist")


def _denial(rule: CommandRule, shown: str) -> Decision:
    command = rule.argv.command
    if command in ("sudo", "su", "doas", "pkexec") and not rule.argv.operands:
        suggestion = f"Remove {command} from the command; the workspace needs no other user."
    else:
        suggestion = f"Leave out {rule.text!r}; if the task needs it, ask the user to run it."
    return Decision(
        Verdict.DENY,
        f"shell.blocked: {rule.text}",
        f"{shown!r} matches the blocked command {rule.text!r}",
        suggestion,
    )


def _xargs_placeholder(own: tuple[Word, ...]) -> str | None:
    """The string xargs -I (or -i, --replace) replaces with each input line, if it is given."""
    for index, word in enumerate(own):
        if word is None:
            continue
        if word in ("-i", "--replace"):
            return "{}"
        if word.startswith("--replace="):
            return word.partition("=")[2] or "{}"
        if word.startswith("-i") and not word.startswith("--"):
            return word[2:]
        if word == "-I":
            following = own[index + 1] if index + 1 < len(own) else None
            return following or "{}"
        if word.startswith("-I"):
            return word[2:]
    return None


def _option_values(
    command: str, words: tuple[Word, ...], options: frozenset[str] | None
) -> list[Word]:
    """The values `words` gives the `options` of `command` (None for one only known at run
    time): `-o F`, `-oF`, `-so F` (the last letter of a cluster), `--output F`, `--output=F`."""
    found: list[Word] = []
    if not options:
        return found
    index = 1
    while index < len(words):
        word = words[index]
        following = words[index + 1] if index + 1 < len(words) else None
        if word is None or word == "--":
            if word == "--":
                break
        elif word in options:
            found.append(following)
            index += 1
        elif word.startswith("--") or command in rulebook.SINGLE_DASH_LONG:
            name, equals, value = word.partition("=")
            if equals and name in options:
                found.append(value)
        elif word.startswith("-") and len(word) > 2:
            for position, letter in enumerate(word[1:], 1):
                if "-" + letter in options:
                    rest = word[position + 1 :]
                    found.append(rest or following)
                    index += 0 if rest else 1
                    break
        index += 1
    return found
