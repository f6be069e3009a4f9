"""Browser tier: Debian's chromium, headless, driven through its chromedriver (selenium),
against a real Airflow API server (``airflow api-server``, SQLite, this repo's plugins) after a
real pipeline run (a batch epoch, then a stream epoch, Spark jobs started by the local
runner). Every process is started here and stopped by process group, also when a test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.runners.pipeline_run import run_pipeline
from modeswitch.runners.processes import start_group, stop_group
from modeswitch.sources.segments import SegmentLog

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).parent / "airflow")
USERS = {"admin": ("admin", "admin-pw"), "viewer": ("viewer", "viewer-pw")}
PIPELINE = {
    "pipeline": "shop",
    "wave_records": "20000",
    "max_split_records": "10000",
    "max_records_per_trigger": "10000",
    "trigger_interval": "200ms",
    "watermark_lag_threshold": "1h",
    "enter_threshold": "1h",
    "exit_threshold": "30m",
    "min_time_in_stream": "0s",
    # No bucket turns idle however slowly the fixture runs: each decision then has a watermark
    # lag, and the chart its lag line (with the default minute, a slow run left every
    # decision's lag undefined and the line undrawn).
    "idle_timeout": "none",
}
DERIVED_LOCATIONS = ("sink", "quarantine", "state_root", "checkpoint_root")


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> PipelineSettings:
    """A pipeline that ran: a backlog two hours old drained by a batch epoch, then a stream
    epoch up to the latest offsets."""
    root = tmp_path_factory.mktemp("pipeline")
    log = SegmentLog.create(str(root / "log"), buckets=4)
    generator = EventGenerator(seed=7, buckets=4, skew="zipf:0.8", malformed_fraction=0.001)
    produce_backlog(log, generator, records=40_000, span=timedelta(hours=2))
    settings = PipelineSettings.from_mapping(
        {**PIPELINE, "source": str(root / "log"), "warehouse": str(root / "warehouse")}
    )
    done = run_pipeline(settings, until="caught-up")
    assert [plan.mode for plan, _, _ in done] == ["batch", "stream"], done
    return settings


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def airflow_url(
    pipeline: PipelineSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A real Airflow API server with this repo's plugins, its Variables set to the pipeline's
    settings; stopped (its whole process group) at the end."""
    home = tmp_path_factory.mktemp("airflow")
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({name: pw for name, pw in USERS.values()}))
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
            f"{name}:{role}" for role, (name, _) in USERS.items()
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
    }
    for name, value in pipeline.to_mapping().items():
        # The locations derived from warehouse and pipeline are left to be derived: set as
        # Variables they would hold for every pipeline the page selects (those of the
        # ``shop`` pipeline for a second one in the warehouse too).
        if name not in DERIVED_LOCATIONS:
            env[f"AIRFLOW_VAR_MODESWITCH_{name.upper()}"] = value
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_file = open(home / "api-server.log", "wb")  # noqa: SIM115 (closed below)
    server = start_group(
        [AIRFLOW, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=env,
        output=log_file,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/api/v2/monitor/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the Airflow API server did not start:\n"
                    + (home / "api-server.log").read_text()[-4000:]
                )
            time.sleep(1)
        yield url
    finally:
        stop_group(server, grace=20)
        log_file.close()


@pytest.fixture(scope="session")
def users() -> dict[str, tuple[str, str]]:
    """Role -> (user name, password) of the API server's simple auth manager."""
    return USERS


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    """Headless chromium through Debian's chromedriver; quit (driver and browser) at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.fail("chromium and chromedriver are needed: `make chromium` installs them")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1700",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()
