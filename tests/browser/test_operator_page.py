"""The operator's page in a real browser: log in through Airflow's own login form, open the
page, and check that it shows what the control tables hold; its actions go through the
control DAG's checks (a bad rewind is refused with the DAG's message). Screenshots are saved
in each test's tmp dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.state import StateStore

WAIT = 60


def log_in(browser, url: str, user: tuple[str, str]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    name, password = user
    browser.get(f"{url}/auth/login/")
    wait = WebDriverWait(browser, WAIT)
    wait.until(ready.presence_of_element_located((By.NAME, "username"))).send_keys(name)
    browser.find_element(By.NAME, "password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda b: any(c["name"] == "_token" for c in b.get_cookies()))


def open_page(browser, url: str, pipeline: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{url}/modeswitch/?pipeline={pipeline}")
    WebDriverWait(browser, WAIT).until(
        lambda b: (
            b.execute_script("return document.body.dataset.loaded") == "true"
            or b.find_element("id", "load-error").text
        )
    )
    assert browser.find_element("id", "load-error").text == ""


def cells(browser, table: str) -> list[list[str]]:
    """The table's cells as shown, read in one script: the page's 5 s poll replaces its rows
    at any time (ci39: a row read element by element went stale halfway)."""
    return browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])]"
        ".map((row) => [...row.querySelectorAll('td')].map((cell) => cell.innerText.trim()))",
        f"#{table} tbody tr",
    )


def test_the_page_shows_what_the_control_tables_hold(
    browser, airflow_url: str, users, pipeline: PipelineSettings, tmp_path: Path
) -> None:
    log_in(browser, airflow_url, users["viewer"])
    open_page(browser, airflow_url, pipeline.pipeline)
    browser.save_screenshot(str(tmp_path / "page.png"))

    store = StateStore.from_settings(pipeline)
    epochs = store.epochs.list()
    assert browser.find_element("css selector", "[data-testid=mode]").text == "stream"
    assert browser.find_element("css selector", "[data-testid=epoch]").text == str(epochs[-1].id)

    committed = store.progress.committed_offsets()
    shown = {int(row[0]): int(row[1].replace(",", "")) for row in cells(browser, "buckets")}
    assert shown == committed

    decisions = store.decisions.list(limit=20)
    rows = cells(browser, "decisions")
    assert [row[3] for row in rows] == [d.decided_by for d in decisions]
    assert rows[0][4] == decisions[0].reason
    assert [row[0] for row in cells(browser, "epochs")] == [str(e.id) for e in reversed(epochs)]

    # The chart is drawn: a band per epoch in its mode, the lag line, the switches.
    chart = browser.find_element("id", "chart")
    bands = chart.find_elements("css selector", "rect.band")
    assert [b.get_attribute("data-mode") for b in bands] == [e.mode for e in epochs]
    assert chart.find_elements("css selector", "polyline.watermark-lag")
    switches = [d for d in decisions if d.switched]
    assert len(chart.find_elements("css selector", "line.switch")) == len(switches) >= 2
    # The settings in effect, and where each came from.
    settings = {row[0]: (row[1], row[2]) for row in cells(browser, "settings")}
    variable = "Airflow Variable 'modeswitch_enter_threshold':"
    assert settings["enter_threshold"] == ("3600s", variable)


def test_the_page_opens_on_all_pipelines_and_a_name_opens_its_own(
    browser, airflow_url: str, users, pipeline: PipelineSettings
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    log_in(browser, airflow_url, users["viewer"])
    browser.get(f"{airflow_url}/modeswitch/")
    WebDriverWait(browser, WAIT).until(
        lambda b: b.execute_script("return document.body.dataset.loaded") == "true"
    )
    assert browser.find_element("id", "load-error").text == ""
    assert not browser.find_element("id", "pipeline-view").is_displayed()
    rows = {row[0]: row for row in cells(browser, "overview")}
    store = StateStore.from_settings(pipeline)
    mine = rows[pipeline.pipeline]
    assert mine[1] == f"stream {store.epochs.list()[-1].id}"
    assert mine[6].startswith(store.decisions.list(limit=1, inputs=False)[0].mode)
    browser.find_element("link text", pipeline.pipeline).click()
    WebDriverWait(browser, WAIT).until(
        lambda b: (
            b.execute_script("return document.body.dataset.loaded") == "true"
            and b.find_element("id", "pipeline-view").is_displayed()
        )
    )
    assert browser.find_element("css selector", "[data-testid=mode]").text == "stream"


def test_the_nav_entry_frames_the_page(browser, airflow_url: str, users, tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    log_in(browser, airflow_url, users["viewer"])
    browser.get(f"{airflow_url}/plugin/modeswitch")
    frame = WebDriverWait(browser, WAIT).until(
        lambda b: b.find_elements("css selector", "iframe[src*='/modeswitch/']")
    )[0]
    browser.switch_to.frame(frame)
    WebDriverWait(browser, WAIT).until(
        lambda b: b.execute_script("return document.body.dataset.loaded") == "true"
    )
    browser.switch_to.default_content()
    browser.save_screenshot(str(tmp_path / "nav.png"))


@pytest.mark.parametrize(
    ("role", "offsets", "message"),
    [
        ("admin", '{"9": 5}', "refused: param offsets: unknown bucket(s) [9]; the log has"),
        ("admin", '{"0": -1}', "refused: param offsets: {'0': -1} must map buckets to offsets"),
        ("admin", "{0:", 'refused: offsets "{0:" is not JSON'),
        # A viewer may look, not command: the auth manager refuses the control DAG's runs.
        ("viewer", '{"0": 1}', "refused: Forbidden: commands need leave to trigger"),
    ],
)
def test_a_bad_rewind_is_refused_on_the_page(
    browser,
    airflow_url: str,
    users,
    pipeline: PipelineSettings,
    role: str,
    offsets: str,
    message: str,
    tmp_path: Path,
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    store = StateStore.from_settings(pipeline)
    before = store.commands.list()
    log_in(browser, airflow_url, users[role])
    open_page(browser, airflow_url, pipeline.pipeline)
    browser.find_element("id", "rewind-offsets").send_keys(offsets)
    browser.find_element("id", "rewind").click()
    result = WebDriverWait(browser, WAIT).until(
        lambda b: (
            b.find_element("id", "action-result").text.startswith("refused")
            and b.find_element("id", "action-result")
        )
    )
    browser.save_screenshot(str(tmp_path / "refused.png"))
    assert result.text.startswith(message), result.text
    assert store.commands.list() == before  # nothing was queued


def test_a_command_from_the_page_is_queued_like_the_control_dags(
    browser, airflow_url: str, users, pipeline: PipelineSettings
) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    store = StateStore.from_settings(pipeline)
    log_in(browser, airflow_url, users["admin"])
    open_page(browser, airflow_url, pipeline.pipeline)
    browser.find_element("id", "note").send_keys("maintenance window")
    browser.find_element("css selector", "button[data-command=pause]").click()
    result = WebDriverWait(browser, WAIT).until(
        lambda b: (
            b.find_element("id", "action-result").text.startswith("queued")
            and b.find_element("id", "action-result")
        )
    )
    command = max(store.commands.list(), key=lambda c: c.id)
    assert result.text == f"queued command {command.id} (pause)"
    assert (command.kind, command.status, command.issuer) == ("pause", "pending", "page admin")
    assert command.args == {"note": "maintenance window"}
    store.commands.reject(command.id, "test over")  # leave the pipeline as it was
