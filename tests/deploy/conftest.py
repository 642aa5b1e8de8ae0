"""Session fixtures of the deployment tests: one Docker engine and one project image per run.

The engine is started (and stopped) here only if none answers; the image build is cached by
Docker between runs. Timings of the slow steps are printed in pytest's terminal summary, so
``make test`` output carries the numbers the deployment issue asks for.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from helpers.deploy import IMAGE, TIMINGS, Engine, EngineUnavailable, Hosts


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory) -> Engine:
    engine = Engine()
    log_dir = tmp_path_factory.mktemp("dockerd")
    try:
        t0 = time.monotonic()
        engine.start(log_dir)
        TIMINGS["engine_ready_s"] = time.monotonic() - t0
        engine.ensure_base_image()
    except EngineUnavailable as exc:
        engine.stop()
        pytest.fail(f"Docker engine unavailable: {exc}", pytrace=False)
    yield engine
    TIMINGS.update(engine.timings)
    engine.stop()


@pytest.fixture(scope="session")
def hushnet_image(docker_engine: Engine) -> str:
    try:
        docker_engine.build_image(IMAGE)
    except EngineUnavailable as exc:
        pytest.fail(f"cannot build the hushnet image: {exc}", pytrace=False)
    TIMINGS["image_build_s"] = docker_engine.timings["image_build_s"]
    return IMAGE


@pytest.fixture()
def hosts(tmp_path):
    """Network namespaces as machines (see :class:`helpers.deploy.Hosts`), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the network-namespace harness needs root and iproute2 ('ip')", pytrace=False)
    h = Hosts(f"hn{os.getpid() % 100000}", tmp_path)
    try:
        yield h
    finally:
        h.teardown()
        leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert h.tag + "-" not in leftover, f"namespaces left behind: {leftover}"


def pytest_terminal_summary(terminalreporter) -> None:
    if TIMINGS:
        terminalreporter.write_line(
            "deploy timings: " + ", ".join(f"{k}={v:.2f}" for k, v in sorted(TIMINGS.items()))
        )
