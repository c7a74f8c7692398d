"""A 200,000-line log in the page: time to show its last line, and a search over it, beside
`run-agent output` printing the same file.

Builds a runs root with one finished run whose stdout is LINES lines of about 90 bytes (about
18 MB), serves it, and drives Debian's chromium (Playwright) to the run's address, then times:

- open: from asking for the page at the run's address to its last line on screen;
- numbers: from asking for the page to its last line's number shown (the server counts the
  lines before the tail; `--lines 1000000` is the 84 MB log whose numbers once never came);
- search: from Enter in the search box to the count of matches shown (in the browser, and the
  search alone measured inside the page);
- `run-agent output --file stdout` of the same file to /dev/null (a whole process).

    python bench/page.py [--lines 200000] [--repeat 5] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.serving import serving  # noqa: E402
from runagent.store import runfolder, taskfolder  # noqa: E402
from runagent.store.runfolder import TaskPaths  # noqa: E402
from runagent.store.runinfo import Reason, RunInfo, RunStatus  # noqa: E402

RUN_ID = "20260101-000000000-1000"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def line(i: int, total: int) -> str:
    return (
        f"2026-01-01T00:00:00Z INFO step {i:06d} of {total}: working through the queue, all fine\n"
    )


def build(root: Path, lines: int) -> Path:
    task = TaskPaths(root, "p", "big")
    taskfolder.write_task_prompt(task, "print a lot")
    folder = runfolder.create_run_folder(task, RUN_ID)
    info = RunInfo(RUN_ID, "p", "big", 1, "bench", "command", "2026-01-01T00:00:00+00:00",
                   str(root), status=RunStatus.COMPLETED, reason=Reason.EXITED, exit_code=0,
                   end_time="2026-01-01T00:01:00+00:00")  # fmt: skip
    runfolder.write_run_info(folder, info)
    stdout = folder / runfolder.STDOUT
    with stdout.open("w") as f:
        f.writelines(line(i, lines) for i in range(1, lines + 1))
    return stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--quick", action="store_true", help="a 2,000-line log, 1 round (for the tests)"
    )
    args = parser.parse_args()
    if args.quick:
        args.lines, args.repeat = 2000, 1
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="bench-page-") as tmp:
        root = Path(tmp) / "runs"
        stdout = build(root, args.lines)
        size_mb = stdout.stat().st_size / 1e6
        print(f"built {args.lines} lines, {size_mb:.1f} MB")
        last = f"step {args.lines:06d} of {args.lines}"
        query = f"step {args.lines // 2:06d}"[:-1]  # ten lines match
        cli = [sys.executable, "-m", "runagent", "output", "-p", "p", "-t", "big",
               "--file", "stdout", "--root", str(root)]  # fmt: skip
        cli_ms = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            subprocess.run(cli, cwd=tmp, stdout=subprocess.DEVNULL, check=True)
            cli_ms.append((time.perf_counter() - started) * 1000)
        open_ms, numbers_ms, search_ms, inside_ms = [], [], [], []
        size = stdout.stat().st_size
        with serving(root, tmp) as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-gpu"])  # fmt: skip
            for _ in range(args.repeat):
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                started = time.perf_counter()
                page.goto(f"{base}/#p/big/{RUN_ID}/stdout")
                page.locator("#log .line", has_text=last).wait_for(state="visible", timeout=60000)
                open_ms.append((time.perf_counter() - started) * 1000)
                page.locator(f"#log .line .ln[data-ln='{args.lines}']").wait_for(timeout=60000)
                numbers_ms.append((time.perf_counter() - started) * 1000)
                # Earlier parts arrive by themselves (up to 64 MiB); search once they are there.
                page.wait_for_function(
                    f"log.from === 0 || (!log.loading && {size} - log.from >= 64 * 1024 * 1024)",
                    timeout=120000,
                )
                page.fill("#search", query)
                started = time.perf_counter()
                page.press("#search", "Enter")
                # The count, whichever match is current: a fill's own search (120 ms after the
                # typing) can run before Enter on a loaded machine, and Enter then goes on to
                # the next match ("1 of 10").
                page.wait_for_function("document.querySelector('#search-count').textContent"
                                       ".endsWith(' of 10')", timeout=120000)  # fmt: skip
                search_ms.append((time.perf_counter() - started) * 1000)
                inside_ms.append(page.evaluate(
                    "() => { const t = performance.now(); search.run();"
                    " return performance.now() - t; }"
                ))  # fmt: skip
                page.close()
            browser.close()
        print(f"{'':<44} {'median':>8} {'max':>8}")
        for name, ms in (
            ("page: open at the run, last line on screen", open_ms),
            ("page: the last line's number shown", numbers_ms),
            ("page: search, Enter to the count shown", search_ms),
            ("  of which the search itself (in the page)", inside_ms),
            ("run-agent output --file stdout (process)", cli_ms),
        ):
            print(f"{name:<44} {statistics.median(ms):>6.0f}ms {max(ms):>6.0f}ms")
        print("goal: last line and its number under 1 s, search under 300 ms")


if __name__ == "__main__":
    main()
