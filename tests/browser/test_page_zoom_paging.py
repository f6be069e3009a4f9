"""The operator's page at scale and up close, in a real browser: the lag chart zooms into a
time range (dragged across it, or typed) and back, and a pipeline of 1 000 buckets shows one
page of them, the worst-lagging first, with a count of all of them, and pages through the rest.

The 1 000-bucket pipeline (``wide``) is control tables only, written with the state store
beside the session's ``shop`` pipeline (no run: a Spark run of 1 000 buckets is not needed to
show a table): a batch epoch whose boundary covers 1 000 buckets, over the session's 4-bucket
source, so buckets 1-3 lag by all the source holds, bucket 0 (its sink holds all but one of
its records: one commit) by 1 record, and the other 996 not at all.
tests/unit/test_status_paging.py checks the status's pages against a real 1 000-bucket log."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pendulum
import pyarrow as pa
import pytest
from test_operator_page import WAIT, log_in, open_page

from modeswitch.control.settings import PipelineSettings
from modeswitch.sinks.delta import DeltaSinkOptions, commit_files, write_files
from modeswitch.sources import open_log
from modeswitch.state import StateStore
from modeswitch.transforms import QUARANTINE_REASON

BUCKETS = 1000
T0 = pendulum.datetime(2026, 1, 1)


@pytest.fixture(scope="module")
def wide(pipeline: PipelineSettings) -> PipelineSettings:
    mapping = pipeline.to_mapping()
    for derived in ("sink", "quarantine", "state_root", "checkpoint_root"):
        del mapping[derived]
    settings = PipelineSettings.from_mapping({**mapping, "pipeline": "wide"})
    epoch = StateStore.from_settings(settings).epochs.open(
        "batch",
        "test: a backlog over 1 000 buckets",
        {b: 0 for b in range(BUCKETS)},
        {b: 10 + b for b in range(BUCKETS)},
    )
    # Bucket 0, the source's largest, committed to one record short: the worst-lagging
    # first are then not the first by number.
    end = open_log(settings.source).latest_offsets()[0] - 1
    options = DeltaSinkOptions.parse(
        {"path": settings.sink, "pipeline": settings.pipeline, "epoch": str(epoch)}
        | {"quarantinePath": settings.quarantine}
    )
    batch = pa.RecordBatch.from_pydict(
        {
            "bucket": pa.array([0] * end, pa.int32()),
            "offset": pa.array(range(end), pa.int64()),
            "event_time": pa.array([T0] * end, pa.timestamp("us", tz="UTC")),
            "key": pa.array(["k"] * end, pa.string()),
            "value": pa.array(["v"] * end, pa.string()),
            QUARANTINE_REASON: pa.array([None] * end, pa.string()),
        }
    )
    written = write_files(options, iter([batch]))
    commit_files(options, batch.schema, [written], sequence=0, start={0: 0}, end={0: end})
    return settings


def cells(browser, table: str) -> list[list[str]]:
    """The table's cells, read in one script: the 5 s poll replaces its rows at any time."""
    return browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])]"
        ".map((row) => [...row.cells].map((cell) => cell.textContent))",
        f"#{table} tbody tr",
    )


def chart_range(browser) -> tuple[pendulum.DateTime, pendulum.DateTime]:
    chart = browser.find_element("id", "chart")
    return pendulum.parse(chart.get_attribute("data-from")), pendulum.parse(
        chart.get_attribute("data-to")
    )


def label(at: pendulum.DateTime) -> str:
    """The page's time format: ISO without the T and the fraction."""
    return at.in_timezone("UTC").isoformat().replace("T", " ")[:19]


def test_the_chart_zooms_into_a_range_and_back(
    browser, airflow_url: str, users, pipeline: PipelineSettings, tmp_path: Path
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    store = StateStore.from_settings(pipeline)
    log_in(browser, airflow_url, users["viewer"])
    open_page(browser, airflow_url, pipeline.pipeline)
    chart = browser.find_element("id", "chart")
    wait = WebDriverWait(browser, WAIT)
    whole = chart_range(browser)
    everything = int(chart.get_attribute("data-points"))
    assert chart.get_attribute("data-zoomed") == "false"
    assert not browser.find_element("id", "zoom-reset").is_enabled()

    # Drag across the middle of the plot (56 px left of it, 64 px right: the axes).
    width = chart.size["width"]
    plot = width - 56 - 64
    start = 56 + 0.3 * plot - width / 2  # offsets from the chart's centre
    ActionChains(browser).move_to_element_with_offset(
        chart, int(start), 0
    ).click_and_hold().move_by_offset(int(0.4 * plot), 0).release().perform()
    wait.until(lambda b: chart.get_attribute("data-zoomed") == "true")
    browser.save_screenshot(str(tmp_path / "zoomed.png"))
    since, until = chart_range(browser)
    span = (whole[1] - whole[0]).total_seconds()
    assert abs((since - whole[0]).total_seconds() - 0.3 * span) < 0.02 * span
    assert abs((until - whole[0]).total_seconds() - 0.7 * span) < 0.02 * span
    # Its axis says so, and it draws the decisions of the range only.
    assert chart.find_element("css selector", "text.t-from").text == label(since)
    assert chart.find_element("css selector", "text.t-to").text == label(until) + " UTC"
    assert int(chart.get_attribute("data-points")) == len(
        store.decisions.list(since=since, until=until)
    )
    assert browser.find_element("id", "zoom-reset").is_enabled()

    # From the keyboard: the range from a second before the first switch to one after the
    # second: two switches drawn, the decisions between them.
    first, second = [d for d in reversed(store.decisions.list()) if d.switched][:2]
    since = (first.at - timedelta(seconds=1)).replace(microsecond=0)
    until = (second.at + timedelta(seconds=1)).replace(microsecond=0)
    for field, value in (("zoom-from", since), ("zoom-to", until)):
        box = browser.find_element("id", field)
        box.clear()
        box.send_keys(value.isoformat())
    box.send_keys(Keys.ENTER)
    wait.until(lambda b: chart_range(b) == (since, until))
    assert len(chart.find_elements("css selector", "line.switch")) == 2
    assert int(chart.get_attribute("data-points")) == len(
        store.decisions.list(since=since, until=until)
    )
    # A time the API cannot read is refused with its reason; the range stays.
    box = browser.find_element("id", "zoom-from")
    box.clear()
    box.send_keys("yesterday", Keys.ENTER)
    refused = wait.until(
        lambda b: (
            b.find_element("id", "zoom-state").text.startswith("zoom refused")
            and b.find_element("id", "zoom-state").text
        )
    )
    assert refused == "zoom refused: param since: 'yesterday' is not an ISO-8601 time"
    assert chart_range(browser) == (since, until)

    browser.find_element("id", "zoom-reset").click()
    wait.until(lambda b: chart.get_attribute("data-zoomed") == "false")
    assert int(chart.get_attribute("data-points")) == everything
    assert chart_range(browser)[0] == whole[0] or chart_range(browser)[0] < since
    assert not browser.find_element("id", "zoom-reset").is_enabled()


def test_1000_buckets_show_a_page_worst_lagging_first(
    browser, airflow_url: str, users, wide: PipelineSettings, tmp_path: Path
) -> None:
    from selenium.webdriver.support.ui import Select, WebDriverWait

    source = open_log(wide.source)
    earliest, latest = source.earliest_offsets(), source.latest_offsets()
    lag = {b: latest.get(b, 0) - earliest.get(b, 0) for b in range(BUCKETS)}
    lag[0] = 1
    worst_first = sorted(range(BUCKETS), key=lambda b: (-lag[b], b))
    assert worst_first[:5] == [1, 2, 3, 0, 4]

    log_in(browser, airflow_url, users["viewer"])
    open_page(browser, airflow_url, wide.pipeline)
    browser.save_screenshot(str(tmp_path / "buckets.png"))
    page = browser.find_element("id", "buckets-page")
    assert page.text == "rows 1\u201350 of 1,000"
    shown = cells(browser, "buckets")
    assert [int(row[0]) for row in shown] == worst_first[:50]
    assert [int(row[4].replace(",", "")) for row in shown[:4]] == [lag[b] for b in worst_first[:4]]
    summary = browser.find_element("id", "buckets-summary").text
    assert summary.startswith(
        f"1,000 buckets: 4 lagging, offset lag {sum(lag.values()):,} in all, "
        f"worst bucket {worst_first[0]} ({lag[worst_first[0]]:,})"
    ), summary
    assert not browser.find_element("id", "buckets-prev").is_enabled()

    wait = WebDriverWait(browser, WAIT)
    browser.find_element("id", "buckets-next").click()
    wait.until(lambda b: page.text == "rows 51\u2013100 of 1,000")
    assert [int(row[0]) for row in cells(browser, "buckets")] == worst_first[50:100]
    browser.find_element("id", "buckets-prev").click()
    wait.until(lambda b: page.text == "rows 1\u201350 of 1,000")

    Select(browser.find_element("id", "bucket-order")).select_by_value("bucket")
    wait.until(lambda b: [int(r[0]) for r in cells(b, "buckets")] == list(range(50)))
    for _ in range(19):
        browser.find_element("id", "buckets-next").click()
    wait.until(lambda b: page.text == "rows 951\u20131,000 of 1,000")
    assert [int(row[0]) for row in cells(browser, "buckets")] == list(range(950, 1000))
    assert not browser.find_element("id", "buckets-next").is_enabled()
