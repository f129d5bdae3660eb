"""Take docs/ui-*.png from a real ``castsql ui`` on the demo warehouse (see scripts/screenshots)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

from castsql.cli.demo import build_demo

DOCS = Path(__file__).resolve().parents[1] / "docs"
# (file, path, what to wait for, SQL to run first)
PAGES = [
    ("ui-warehouse.png", "/", "#tables", None),
    ("ui-table.png", "/tables/events", "#exact-note[data-done='1']", None),
    ("ui-diff.png", "/tables/events/diff?from=5&to=6", "#diff", None),
    ("ui-rows.png", "/tables/events/rows/70007", "#history", None),
    ("ui-schema.png", "/tables/events/schema", "#schema", None),
    ("ui-sql.png", "/sql?q=SELECT+kind%2C+count(*)+AS+n%2C+round(sum(amount))+AS+amount+FROM+events+AS+OF+VERSION+6"
     "+GROUP+BY+kind+ORDER+BY+n+DESC", "#result tbody tr", None),
]


def main(demo: str) -> int:
    build_demo(demo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "castsql.cli", "ui", demo, "--no-browser", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://\S+", line).group(0)
        base = url.split("/?", 1)[0]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(url)
            for name, path, ready, _ in PAGES:
                page.goto(base + path)
                page.wait_for_selector(ready, timeout=60_000)
                page.wait_for_timeout(300)
                page.screenshot(path=str(DOCS / name))
                print(f"docs/{name}: {(DOCS / name).stat().st_size // 1024} KB")
            browser.close()
    finally:
        proc.send_signal(2)
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "./demo-warehouse"))
