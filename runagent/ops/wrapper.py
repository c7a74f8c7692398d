"""The commands that run another command (env, timeout, sudo, xargs, a shell with -c, find -exec)
and where, in their argv, the command they run starts."""

from __future__ import annotations

import re
import shlex
from typing import Any

from runagent.ops.shellsyntax import Assignment, Word
from runagent.record import record

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@record
class Wrapper:
    """How one wrapper's argv reads: its options, then operands, then the command it runs."""

    value_options: frozenset[str] = frozenset()  # the next word (or the rest of -xVALUE) is a value
    flag_options: frozenset[str] = frozenset()
    operands: int = 0  # words before the command: timeout's duration, chroot's directory
    assignments: bool = False  # env NAME=value ...
    numeric_options: bool = False  # nice -10
    appends: bool = False  # xargs: the command gets more words, read from stdin
    script_options: frozenset[str] = frozenset()  # the value is a shell script: su -c, flock -c
    split_options: frozenset[str] = frozenset()  # env -S 'cmd args': one word split into an argv
    inspect_options: frozenset[str] = frozenset()  # command -v: looks the name up, runs nothing
    chdir_options: frozenset[str] = frozenset()  # env -C dir: the command runs elsewhere
    moves: bool = False  # chroot: the command always runs elsewhere


def _w(values: str = "", flags: str = "", **kwargs: Any) -> Wrapper:
    return Wrapper(frozenset(values.split()), frozenset(flags.split()), **kwargs)


# Every wrapper that the public bypass reports named, and the common ones beside them. An option
# not listed here makes the command unknown (approval): guessing whether it takes a value could
# take the wrapped command for an option's value.
WRAPPERS: dict[str, Wrapper] = {
    "env": _w(
        "-u --unset -C --chdir -S --split-string",
        "-i --ignore-environment -0 --null -v --debug -",
        assignments=True,
        split_options=frozenset({"-S", "--split-string"}),
        chdir_options=frozenset({"-C", "--chdir"}),
    ),
    "timeout": _w(
        "-s --signal -k --kill-after", "--foreground --preserve-status -v --verbose", operands=1
    ),
    "nice": _w("-n --adjustment", numeric_options=True),
    "nohup": _w(),
    "setsid": _w("", "-c --ctty -f --fork -w --wait"),
    "time": _w("-o --output -f --format", "-p -v --verbose -a --append -q --quiet --portability"),
    "command": _w("", "-p", inspect_options=frozenset({"-v", "-V"})),
    "builtin": _w(),
    "busybox": _w(),  # busybox rm -rf x: the applet is the command
    "coproc": _w(),
    "noglob": _w(),
    "exec": _w("-a", "-c -l"),
    "stdbuf": _w("-i --input -o --output -e --error"),
    "ionice": _w("-c --class -n --classdata", "-t --ignore"),
    "chrt": _w(
        "",
        "-a --all-tasks -b --batch -d --deadline -f --fifo -i --idle -o --other -r --rr -R "
        "--reset-on-fork -v --verbose",
        operands=1,
    ),
    "taskset": _w("", "-a --all-tasks -c --cpu-list", operands=1),
    "unbuffer": _w("", "-p"),
    "sudo": _w(
        "-u --user -g --group -p --prompt -C --close-from -D --chdir -h --host -r --role -t "
        "--type -U --other-user -T --command-timeout",
        "-A --askpass -b --background -E --preserve-env -H --set-home -k --reset-timestamp -n "
        "--non-interactive -P --preserve-groups -S --stdin -B --bell -N --no-update",
        inspect_options=frozenset({"-l", "--list", "-v", "--validate", "-K", "-V"}),
        chdir_options=frozenset({"-D", "--chdir"}),
    ),
    "doas": _w("-u -C", "-n -s"),
    "su": _w(
        "-g --group -G --supp-group -s --shell -c --command -w --whitelist-environment",
        "- -l --login -m -p --preserve-environment -f --fast -P --pty",
        script_options=frozenset({"-c", "--command"}),
        operands=1,  # su [user] -c script: the user may come first
    ),
    "runuser": _w(
        "-u --user -g --group -G --supp-group -s --shell -c --command -w",
        "- -l --login -m -p --preserve-environment -f --fast -P --pty",
        script_options=frozenset({"-c", "--command"}),
    ),
    "xargs": _w(
        "-a --arg-file -d --delimiter -E -e --eof -I -i --replace -L -l --max-lines -n --max-args "
        "-P --max-procs -s --max-chars --process-slot-var",
        "-0 --null -o --open-tty -p --interactive -r --no-run-if-empty -t --verbose -x --exit",
        appends=True,
    ),
    "chroot": _w("--userspec --groups", "--skip-chdir", operands=1, moves=True),
    "flock": _w(
        "-w --wait --timeout -E --conflict-exit-code",
        "-s --shared -x -e --exclusive -u --unlock -n --nb --nonblock -o --close -F --no-fork "
        "--verbose",
        operands=1,
        script_options=frozenset({"-c", "--command"}),
    ),
    "watch": _w(
        "-n --interval -d --differences -q --equexit",
        "-b --beep -c --color -e --errexit -g --chgexit -p --precise -t --no-title -x --exec -w "
        "--no-wrap",
    ),
}

# Wrappers that run the command as someone else, or somewhere else: never transparent.
PRIVILEGED = frozenset({"sudo", "doas", "su", "runuser", "chroot"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash"})
INTERPRETERS = SHELLS | frozenset(
    {"python", "python3", "perl", "ruby", "node", "php", "lua", "fish", "tclsh", "osascript"}
)


@record
class Unwrapped:
    """A wrapper's argv taken apart; `problem` says why where the command starts is unknown."""

    own: tuple[Word, ...]
    commands: tuple[tuple[Word, ...], ...] = ()
    assignments: tuple[Assignment, ...] = ()
    scripts: tuple[Word, ...] = ()  # shell scripts it runs, to be parsed in turn
    appends: bool = False
    problem: str | None = None
    moves: bool = False  # the command runs in another folder: relative paths are unknown


def unwrap(name: str, words: tuple[Word, ...]) -> Unwrapped | None:
    """`words` (whose command is `name`) taken apart if `name` is a wrapper, otherwise None."""
    if name in SHELLS:
        return _shell(name, words)
    if name == "find":
        return _find(words)
    if name == "watch" and len(words) > 1:
        # watch joins its words into a script for sh -c.
        parsed = _options(name, WRAPPERS[name], words)
        if parsed.problem is None and parsed.commands:
            inner = parsed.commands[0]
            joined = None if None in inner else " ".join(w for w in inner if w)
            return Unwrapped(parsed.own, scripts=(joined,))
        return parsed
    wrapper = WRAPPERS.get(name)
    return _options(name, wrapper, words) if wrapper is not None else None


def _options(name: str, wrapper: Wrapper, words: tuple[Word, ...]) -> Unwrapped:
    index = 1
    assignments: list[Assignment] = []
    scripts: list[Word] = []
    inner_from_split: tuple[Word, ...] = ()
    operands = wrapper.operands
    moves = wrapper.moves
    while index < len(words):
        word = words[index]
        if word is None:
            return Unwrapped(words, problem=f"`{name}` has a word only known at run time")
        if word == "--":
            index += 1
            break
        if (word.startswith("-") and word != "-") or word in wrapper.flag_options:
            option, _, inline = word.partition("=") if word.startswith("--") else (word, "", "")
            takes = _takes_value(wrapper, option)
            if takes is None:
                return Unwrapped(words, problem=f"`{name}` option {word!r} is not known here")
            if option in wrapper.inspect_options:
                return Unwrapped(words)  # looks the command up, runs nothing
            value: Word = inline or None
            if takes[0] and not inline:
                if takes[1]:
                    value = takes[1]
                else:
                    index += 1
                    value = words[index] if index < len(words) else None
            moves = moves or takes[2] in wrapper.chdir_options
            if takes[0] and takes[2] in wrapper.script_options:
                scripts.append(value)
            elif takes[0] and takes[2] in wrapper.split_options:
                try:
                    inner_from_split = tuple(shlex.split(value)) if value is not None else (None,)
                except ValueError:
                    inner_from_split = (None,)
            index += 1
            continue
        if wrapper.assignments and _NAME.match(word):
            key, _, value_text = word.partition("=")
            assignments.append(Assignment(key, value_text))
        elif operands:
            operands -= 1
        else:
            break
        index += 1
    inner = inner_from_split + words[index:]
    return Unwrapped(
        words[:index],
        (inner,) if inner else (),
        tuple(assignments),
        tuple(scripts),
        wrapper.appends,
        moves=moves,
    )


def _takes_value(wrapper: Wrapper, option: str) -> tuple[bool, str, str] | None:
    """(takes a value, the value if glued on, the option's name) or None if not known."""
    known = wrapper.value_options | wrapper.flag_options | wrapper.inspect_options
    if option in wrapper.value_options:
        return (True, "", option)
    if option in known or (wrapper.numeric_options and option[1:].isdigit()):
        return (False, "", option)
    if option.startswith("--") or len(option) < 3:
        return None
    # Combined short options: -Eu root, -n10, -xc script.
    for position in range(1, len(option)):
        short = "-" + option[position]
        if short in wrapper.value_options:
            return (True, option[position + 1 :], short)
        if short not in known:
            return None
    return (False, "", option)


def _shell(name: str, words: tuple[Word, ...]) -> Unwrapped:
    """sh -c 'script': the script is the first operand; without -c the operand is a file."""
    command = False
    index = 1
    while index < len(words):
        word = words[index]
        if word is None:
            return Unwrapped(words, problem=f"`{name}` has a word only known at run time")
        if word in ("--", "-"):
            index += 1
            break
        if word in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            index += 2
            continue
        if word[:1] in "-+" and len(word) > 1:
            command = command or (not word.startswith("--") and "c" in word[1:])
            index += 1
            continue
        break
    if command:
        script = words[index] if index < len(words) else None
        return Unwrapped(words[:index], scripts=(script,))
    return Unwrapped(words)


def _find(words: tuple[Word, ...]) -> Unwrapped:
    """find -exec cmd {} ; (and -execdir, -ok, -okdir) runs cmd once per file found."""
    commands: list[tuple[Word, ...]] = []
    index = 1
    while index < len(words):
        if words[index] in ("-exec", "-execdir", "-ok", "-okdir"):
            end = index + 1
            while end < len(words) and words[end] not in (";", "+"):
                end += 1
            # {} is a file found at run time: a word nobody knows yet.
            commands.append(tuple(None if w == "{}" else w for w in words[index + 1 : end]))
            index = end
        index += 1
    return Unwrapped(words, commands=tuple(commands))
