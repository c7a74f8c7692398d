"""Git on the host never runs what a sandboxed agent wrote: a worktree agent under real bubblewrap
plants hooks, a file system monitor and git folders of its own making (a `commondir`, a `.git`
file), and every git command run-agent runs after it (the ready marker's check, stuck detection,
`status`, `worktrees`, `merge`), and the user's own next commit, runs none of it. Each planted
program appends to a file outside the sandbox's reach, so only a run on the host is counted."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from runagent.errors import ExitCode
from runagent.ops.sandbox import Bwrap
from tests.conftest import Workspace
from tests.gitrepo import GIT_ENV, commit, git, make_repo

pytestmark = pytest.mark.skipif(
    Bwrap(Path("/")).problem() is not None, reason="bubblewrap cannot run here"
)

HOOKS = (
    "pre-commit prepare-commit-msg commit-msg post-commit pre-merge-commit post-merge "
    "post-checkout reference-transaction pre-auto-gc post-rewrite pre-push post-index-change "
    "fsmonitor-watchman"
)


def planter(runs: Path) -> str:
    """The shell of an agent that writes `program` (which counts its runs in `runs`) into
    every hook folder it can reach, and a function to plant config pointing at it."""
    return f"""
program='#!/bin/sh
echo "$0 $*" >> {runs} 2>/dev/null
exit 0'
common=$(git rev-parse --path-format=absolute --git-common-dir)
own=$(git rev-parse --absolute-git-dir)
plant() {{
  mkdir -p "$1" 2>/dev/null
  for h in {HOOKS}; do
    printf '%s\\n' "$program" > "$1/$h" 2>/dev/null && chmod +x "$1/$h" 2>/dev/null
  done
}}
evil_config() {{
  printf '[core]\\n\\tfsmonitor = %s\\n\\thooksPath = %s\\n[diff]\\n\\texternal = %s\\n' \\
    "$1/hooks/post-commit" "$1/hooks" "$1/hooks/post-commit"
}}
plant "$common/hooks"
plant "$own/hooks"
git config core.fsmonitor "$common/hooks/post-commit" 2>/dev/null
git config core.hooksPath "$own/hooks" 2>/dev/null
"""


def sandboxed_worktree(ws: Workspace, shell: str, *args: str) -> Path:
    """A repository with no hooks folder, a sandboxed worktree agent that commits its work with
    the ready marker and then runs `shell`; the repository once its task has completed."""
    repo = make_repo(ws.path / "repo")
    commit(repo, "the shared file", name="shared.txt", text="original\n")
    common = Path(git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir"))
    subprocess.run(["rm", "-rf", str(common / "hooks")], check=True)
    return sandboxed_worktree_in(ws, repo, shell, *args)


def sandboxed_worktree_in(ws: Workspace, repo: Path, shell: str, *args: str) -> Path:
    ws.write_config(["--ready-from", "1", "--shell", shell], env=GIT_ENV, max_restarts=0,
                    until="ready-marker")  # fmt: skip
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fake"]["sandbox"] = "bwrap"
    ws.config.write_text(yaml.safe_dump(data))
    done = subprocess.run(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), "-p", "p", "-t", "t",
                    "--worktree", "--stuck-after", "2", *args, "go"),
        cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    runs = ws.task("p", "t").folder / "runs"
    said = [(r / "agent-stderr.txt").read_text() for r in runs.iterdir()] if runs.is_dir() else []
    assert done.returncode == ExitCode.COMPLETED, (done.stderr, said)
    return repo


def host_commands(ws: Workspace, repo: Path) -> subprocess.CompletedProcess[str]:
    """What a user does next: status, worktrees, merge, and a commit of their own; the merge."""
    env = {**os.environ, **GIT_ENV}
    base = ws.cli_argv("--config", str(ws.config), "--root", str(ws.root))
    for args in (["status", "-p", "p", "-t", "t", "--json"], ["worktrees"]):
        subprocess.run([*base, *args], cwd=repo, env=env, capture_output=True, timeout=60)
    merged = subprocess.run([*base, "merge", "-p", "p", "-t", "t"], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    commit(repo, "the user's own next commit", name="mine.txt")
    return merged


def test_hooks_and_config_a_worktree_agent_plants_never_run_on_the_host(
    ws_outside: Workspace,
) -> None:
    ws = ws_outside
    runs = ws.path / "host-runs"
    shell = (
        planter(runs)
        + """
evil="$own/evil-common"
mkdir -p "$evil" && ln -s "$common/objects" "$evil/objects" && ln -s "$common/refs" "$evil/refs"
cp "$common/HEAD" "$evil/HEAD"; cp "$common/packed-refs" "$evil/packed-refs" 2>/dev/null
plant "$evil/hooks"
evil_config "$evil" > "$evil/config"
evil_config "$evil" > "$own/config.worktree"
echo "$evil" > "$own/commondir" 2>/dev/null
true
"""
    )
    repo = sandboxed_worktree(ws, shell)
    merged = host_commands(ws, repo)
    assert merged.returncode == 0, merged.stderr
    assert not runs.exists(), runs.read_text()
    assert "fake-agent-work.txt" in git(repo, "ls-files")  # the work came back


def test_a_git_file_pointing_at_a_git_folder_of_the_agents_making_is_never_followed(
    ws_outside: Workspace,
) -> None:
    ws = ws_outside
    runs = ws.path / "host-runs"
    shell = (
        planter(runs)
        + """
evil="$PWD/.evil"
git clone -q --bare --shared "$common" "$evil"
git --git-dir="$evil" symbolic-ref HEAD "$(git symbolic-ref HEAD)"
plant "$evil/hooks"
evil_config "$evil" >> "$evil/config"
printf 'gitdir: %s\\n' "$evil" > .git
true
"""
    )
    repo = sandboxed_worktree(ws, shell)
    host_commands(ws, repo)
    assert not runs.exists(), runs.read_text()


def test_host_commands_name_the_recorded_git_folder_whatever_the_git_file_says(
    ws_outside: Workspace,
) -> None:
    """Whatever rewrites a worktree's `.git` file (here the test, as an unsandboxed agent
    could), run-agent's own git commands there use the git folder it wrote down."""
    ws = ws_outside
    runs = ws.path / "host-runs"
    repo = make_repo(ws.path / "repo")
    ws.write_config(["--commit", "work"], env=GIT_ENV, max_restarts=0)
    done = subprocess.run(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), "-p", "p", "-t", "t",
                    "--worktree", "go"),
        cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    tree = ws.task("p", "t").worktree
    evil = ws.path / "evil.git"
    git(ws.path, "clone", "-q", "--bare", "--shared", str(repo), str(evil))
    monitor = evil / "monitor"
    monitor.write_text(f'#!/bin/sh\necho "$0" >> {runs}\nexit 0\n')
    monitor.chmod(0o755)
    for hook in HOOKS.split():
        (evil / "hooks" / hook).write_text(monitor.read_text())
        (evil / "hooks" / hook).chmod(0o755)
    with open(evil / "config", "a") as f:
        f.write(
            f"[core]\n\tfsmonitor = {monitor}\n\tbare = false\n[diff]\n\texternal = {monitor}\n"
        )
    (tree / ".git").write_text(f"gitdir: {evil}\n")
    merged = host_commands(ws, repo)
    assert merged.returncode == 0, merged.stderr
    assert not runs.exists(), runs.read_text()
    assert "fake-agent-work.txt" in git(repo, "ls-files")


def test_a_sandboxed_worktree_agent_moves_no_ref_of_the_repository_but_its_branch(
    ws_outside: Workspace,
) -> None:
    """It moves `main`, makes a branch and a tag, and rewrites a loose object of the user's
    history: none of it reaches the repository; its own branch there is its work, once run."""
    ws = ws_outside
    repo = make_repo(ws.path / "repo")
    user = repo / ".git"
    shell = f"""
git update-ref refs/heads/main HEAD 2>/dev/null
git --git-dir={user} update-ref refs/heads/main HEAD 2>/dev/null
git branch planted HEAD 2>/dev/null
git --git-dir={user} branch planted HEAD 2>/dev/null
git --git-dir={user} tag planted-tag HEAD 2>/dev/null
for f in {user}/objects/??/*; do chmod u+w "$f" 2>/dev/null; : > "$f" 2>/dev/null; done
true
"""
    main = git(repo, "rev-parse", "main")
    sandboxed_worktree_in(ws, repo, shell)
    assert git(repo, "rev-parse", "main") == main
    assert git(repo, "branch", "--list", "planted") == ""
    assert git(repo, "tag", "--list") == ""
    git(repo, "fsck", "--no-dangling")  # no object of its history was rewritten
    tip = git(repo, "rev-parse", "run-agent/p/t")
    assert "finish attempt 1" in git(repo, "log", "-1", "--format=%s", tip)


def test_merge_push_takes_no_setting_a_sandboxed_agent_wrote(ws_outside: Workspace) -> None:
    """`merge --push` runs git in the user's repository, whose config the agent cannot write
    (its own clone's neither): an ssh command, a credential helper and a push URL it plants
    there do not run or redirect the push, which lands in the remote the user named."""
    ws = ws_outside
    repo = make_repo(ws.path / "repo")
    remote = ws.path / "remote.git"
    git(ws.path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    ran, elsewhere = ws.path / "planted-ran", ws.path / "elsewhere.git"
    git(ws.path, "init", "-q", "--bare", str(elsewhere))
    user = repo / ".git"
    before = (user / "config").read_text()
    plant = f"""
for where in "" "--git-dir={user}"; do
  git $where config core.sshCommand "touch {ran}" 2>/dev/null
  git $where config credential.helper "!touch {ran}" 2>/dev/null
  git $where config remote.origin.pushurl "{elsewhere}" 2>/dev/null
  git $where config remote.origin.receivepack "touch {ran}; git-receive-pack" 2>/dev/null
done
printf '[remote "origin"]\\n\\tpushurl = {elsewhere}\\n' >> {user}/config 2>/dev/null
true
"""
    sandboxed_worktree_in(ws, repo, plant)
    assert (user / "config").read_text() == before
    pushed = subprocess.run(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), "merge", "-p", "p",
                    "-t", "t", "--push", "origin"),
        cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    assert not ran.exists()
    assert git(remote, "rev-parse", "run-agent/p/t") == git(repo, "rev-parse", "run-agent/p/t")
    assert git(elsewhere, "for-each-ref") == ""


def test_filters_a_worktree_agent_configures_never_run_on_the_host(ws_outside: Workspace) -> None:
    """It tries to name clean, smudge and long-running filter programs in its clone's config
    (read-only to it), applies them to every file by a `.gitattributes`, and leaves a file
    changed at the same size (so git must read it to tell): `status`, `worktrees`, stuck
    detection and `merge` read that tree on the host and run none of them."""
    ws = ws_outside
    runs = ws.path / "host-runs"
    shell = (
        planter(runs)
        + """
for field in clean smudge process; do
  git config "filter.evil.$field" "$own/hooks/post-commit" 2>/dev/null
done
git config filter.evil.required true 2>/dev/null
printf '* filter=evil\\n' > .gitattributes
sleep 1
f=$(git ls-files | head -n 1)
tr 'a-z' 'b-za' < "$f" > .swap && cat .swap > "$f" && rm -f .swap
true
"""
    )
    repo = sandboxed_worktree(ws, shell)
    host_commands(ws, repo)
    assert not runs.exists(), runs.read_text()


def test_a_submodule_a_worktree_agent_makes_runs_nothing_on_the_host(
    ws_outside: Workspace,
) -> None:
    """It adds a submodule whose own git folder it writes (its clone's config is read-only to
    it, that one is not): the submodule's config names a smudge filter and an update command,
    and its checkout has moved on from the commit recorded. The task's next loop reopens the
    worktree and runs neither on the host."""
    ws = ws_outside
    runs = ws.path / "host-runs"
    shell = (
        planter(runs)
        + """
if [ ! -d sub ]; then
  git init -q sub
  printf '* filter=evil\\n' > sub/.gitattributes && echo one > sub/file.txt
  git -C sub add -A && git -C sub commit -q -m one
  for field in clean smudge process; do
    git -C sub config "filter.evil.$field" "$own/../host-program"
  done
  git -C sub config submodule.recurse false
  git update-index --add --cacheinfo "160000,$(git -C sub rev-parse HEAD),sub"
  printf '[submodule "sub"]\\n\\tpath = sub\\n\\turl = ./sub\\n' > .gitmodules
  git add .gitmodules && git commit -q -m "a submodule"
  echo two > sub/file.txt && git -C sub commit -q -a -m two
fi
true
"""
    )
    repo = sandboxed_worktree(ws, shell)
    program = ws.task("p", "t").folder / "host-program"
    program.write_text(f'#!/bin/sh\necho "$0 $*" >> {runs}\ncat\n')
    program.chmod(0o755)
    again = subprocess.run(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), "resume", "-p", "p",
                    "-t", "t", "--again"),
        cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" not in again.stderr, again.stderr
    assert again.returncode == ExitCode.COMPLETED, again.stderr
    assert not runs.exists(), runs.read_text()
