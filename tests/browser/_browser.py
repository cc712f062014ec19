"""Headless Chromium for the browser tests: render a page from disk, screenshot it, read its
network log. Test support only (moved out of ``tl_directional.views.report``); the package itself
never starts a browser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

#: Flags for a headless Chromium that should not talk to anyone by itself.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
    "--disable-domain-reliability", "--disable-client-side-phishing-detection", "--no-pings",
    "--disable-breakpad", "--no-default-browser-check", "--disable-dev-shm-usage", "--hide-scrollbars",
    "--disable-features=NetworkTimeServiceQuerying,OptimizationHints,MediaRouter,Translate",
    # Chromium still makes a few background requests of its own (update checks); no host name
    # resolves, so neither they nor anything else can leave the machine. Attempts stay in the log.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
)


def chromium_path() -> str | None:
    """A Chromium/Chrome executable: ``$TLD_CHROMIUM``, else ``chromium``, ``chromium-browser``,
    ``google-chrome`` on ``PATH`` (Debian's package installs ``/usr/bin/chromium``), else None."""
    env = os.environ.get("TLD_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


def run_chromium(page: str | Path, workdir: str | Path, *, mode: str = "dom", width: int = 1400,
                 height: int = 2400, scale: float = 1.0, budget_ms: int = 15000, timeout: float = 180.0,
                 chromium: str | None = None, extra: Sequence[str] = ()) -> dict:
    """Open ``page`` (a file) in a fresh headless Chromium profile under ``workdir``.

    ``mode="dom"``: returns the DOM after scripts ran (``dom``); ``mode="screenshot"``:
    writes ``workdir/screenshot.png`` (``png``). Always records Chromium's network log
    (``netlog``, the path of a net-export JSON) and stderr (``stderr``, with console
    messages). Raises RuntimeError when Chromium is missing or fails.
    """
    exe = chromium or chromium_path()
    if exe is None:
        raise RuntimeError("no Chromium found; install Debian's 'chromium' or set TLD_CHROMIUM")
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    profile_dir = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=work))
    netlog = work / f"netlog-{mode}.json"
    cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", f"--log-net-log={netlog}",
           "--net-log-capture-mode=Default", "--enable-logging=stderr", "--v=0",
           f"--window-size={width},{height}", f"--force-device-scale-factor={scale}",
           f"--virtual-time-budget={budget_ms}", *extra]
    png = work / "screenshot.png"
    if mode == "dom":
        cmd.append("--dump-dom")
    elif mode == "screenshot":
        cmd.append(f"--screenshot={png}")
    else:
        raise ValueError(f"mode must be 'dom' or 'screenshot', got {mode!r}")
    cmd.append(Path(page).resolve().as_uri())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=work)
    if proc.returncode != 0 or (mode == "screenshot" and not png.is_file()):
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"dom": proc.stdout, "stderr": proc.stderr, "netlog": netlog,
            "png": png if mode == "screenshot" else None, "command": cmd}


def read_netlog(path: str | Path) -> list[dict]:
    """URL requests in a Chromium net-export log: ``{"url", "initiator", "isolation", "page"}``
    per request. ``page`` is True for requests made by a page opened from disk (initiator
    ``null`` or a ``file://`` isolation key); Chromium's own background requests carry
    initiator ``"not an origin"``. Tolerates a log whose closing brackets are missing."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        log = json.loads(text)
    except json.JSONDecodeError:
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    types = log["constants"]["logEventTypes"]
    start = types["URL_REQUEST_START_JOB"]
    out = []
    for ev in log.get("events", []):
        if ev.get("type") != start:
            continue
        p = ev.get("params") or {}
        if "url" not in p:
            continue
        initiator = p.get("initiator", "")
        isolation = p.get("network_isolation_key", "")
        out.append({"url": p["url"], "initiator": initiator, "isolation": isolation,
                    "page": initiator != "not an origin" or isolation.startswith("file://")})
    return out


def page_requests_off_machine(netlog: str | Path) -> list[str]:
    """URLs the page (not Chromium itself) asked for that are not on this machine
    (anything but ``file:``, ``data:``, ``blob:``, ``about:``, ``chrome:`` and localhost)."""
    local = ("file:", "data:", "blob:", "about:", "chrome:", "chrome-extension:",
             "http://localhost", "http://127.0.0.1", "https://localhost", "https://127.0.0.1")
    return [r["url"] for r in read_netlog(netlog) if r["page"] and not r["url"].startswith(local)]
