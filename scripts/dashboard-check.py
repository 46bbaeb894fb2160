#!/usr/bin/env python3
"""Browser check of the live dashboard (`GET /` on the admin address) in headless Chromium.

Starts the simulator and `goodput serve` (config/demo.toml: SLO classes, cost, calibration,
plus an admin token), drives streaming load through the proxy, and opens the page:
- without a token the page is the token form; a wrong token is refused, the right one
  opens the dashboard, and the token never appears in the URL;
- once the load has stopped (so the window's counts are frozen), the numbers shown equal
  the summary the page rendered, and its counts equal a fresh `/api/v1/summary`;
- every chart is drawn with data, the recent requests are listed, empty states show where
  there is nothing (drift is off);
- the browser console has no error once the token is accepted;
- screenshots go to target/dashboard.png (the token form and the
  empty dashboard to target/dashboard-login.png and target/dashboard-empty.png).
Usage: scripts/dashboard-check.py [BINARY] (default target/debug/goodput). Needs Debian's
chromium and chromium-driver and `pip install selenium`.
"""
import json, os, re, subprocess, sys, tempfile, threading, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from ports import free_ports, wait_port

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/debug/goodput"
TOKEN = "dashboard-check-token-1234567890"
LOAD_SECONDS = 16
SCREENSHOT = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "dashboard.png")


def api(admin, path, token=TOKEN):
    req = urllib.request.Request(f"http://127.0.0.1:{admin}{path}",
                                 headers={"Authorization": f"Bearer {token}"})
    return json.load(urllib.request.urlopen(req, timeout=5))


def load(proxy, stop):
    """Streaming chat requests of varied length until `stop` is set."""
    def worker(i):
        n = 0
        while not stop.is_set():
            n += 1
            body = json.dumps({
                "model": "sim-model", "stream": True, "max_tokens": 16 + (i * 37 + n * 11) % 120,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "x" * (50 + (i * 997 + n * 131) % 6000)}],
            }).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{proxy}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(worker, range(6)))


def browser():
    opts = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1440,2700",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='goodput-chromium-')}"):
        opts.add_argument(flag)
    opts.binary_location = "/usr/bin/chromium"
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def severe(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def visible(driver, css):
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return bool(els) and els[0].is_displayed()


def parse(text):
    m = re.search(r"-?[\d,]+(\.\d+)?", text)
    assert m, f"no number in {text!r}"
    return float(m.group(0).replace(",", ""))


def check_numbers(driver, summary):
    """Every [data-key] element shows its value from `summary` (to the shown precision)."""
    checked = 0
    for el in driver.find_elements(By.CSS_SELECTOR, "[data-key]"):
        key, unit, text = el.get_attribute("data-key"), el.get_attribute("data-unit"), el.text
        value = summary
        for part in key.split("."):
            value = value[part]
        if value is None:
            assert text.startswith("–"), f"{key}: shows {text!r} for null"
            continue
        shown = parse(text)
        want = value * 100 if unit == "%" else value
        decimals = len(text.split(".")[1].split()[0]) if "." in text.split()[0] else 0
        assert abs(shown - want) <= 0.5 * 10 ** -decimals + 1e-9, f"{key}: shows {text!r}, summary has {value}"
        checked += 1
    assert checked >= 10, f"only {checked} numbers checked"
    return checked


def main():
    sim_port, proxy, admin = free_ports(3)
    tmp = tempfile.mkdtemp(prefix="goodput-dashboard-")
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    cfg = os.path.join(tmp, "goodput.toml")
    with open("config/demo.toml") as f:
        demo = f.read()
    with open(cfg, "w") as f:
        f.write(demo + f'\n[admin]\ntoken_file = "{token_file}"\n')
    procs = [subprocess.Popen([BIN, "sim", "--listen", f"127.0.0.1:{sim_port}", "--seed", "3",
                               "--concurrency-knee", "4"])]
    wait_port(sim_port, procs[0])
    procs.append(subprocess.Popen([BIN, "serve", "--config", cfg, "--listen", f"127.0.0.1:{proxy}",
                                   "--admin", f"127.0.0.1:{admin}",
                                   "--upstream", f"http://127.0.0.1:{sim_port}"],
                                  stderr=open(os.path.join(tmp, "serve.log"), "w")))
    wait_port(proxy, procs[1])
    wait_port(admin, procs[1])
    url = f"http://127.0.0.1:{admin}/"
    stop = threading.Event()
    loader = threading.Thread(target=load, args=(proxy, stop), daemon=True)
    driver = None
    try:
        driver = browser()
        wait = WebDriverWait(driver, 20)

        # Without a token: the form, nothing else.
        driver.get(url)
        wait.until(lambda d: visible(d, "#login"))
        assert not visible(driver, "#dash"), "dashboard shown without a token"
        errors = severe(driver)
        assert all("401" in e["message"] for e in errors), f"console errors besides the 401s: {errors}"
        # A wrong token is refused and forgotten.
        driver.find_element(By.ID, "token").send_keys("wrong-token")
        driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait.until(lambda d: visible(d, "#login-error"))
        assert driver.execute_script("return sessionStorage.getItem('goodput.admin.token')") is None
        os.makedirs(os.path.dirname(SCREENSHOT) or ".", exist_ok=True)
        driver.save_screenshot(SCREENSHOT.replace(".png", "-login.png"))
        severe(driver)  # the refused call's 401 is expected
        # The right one opens the dashboard; it lives in sessionStorage, never in the URL.
        driver.find_element(By.ID, "token").send_keys(TOKEN)
        driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait.until(lambda d: visible(d, "#dash") and d.execute_script("return window.goodputDashboard.polls") > 0)
        assert TOKEN not in driver.current_url and driver.current_url == url, driver.current_url
        assert driver.execute_script("return sessionStorage.getItem('goodput.admin.token')") == TOKEN
        print("token flow: form without a token, wrong token refused, right token opens the dashboard")

        # Before any traffic: empty states, not broken charts.
        for chart in ("chart-goodput", "chart-ttft", "chart-tpot", "chart-itl", "chart-input", "chart-capacity"):
            text = driver.find_element(By.ID, chart).text
            assert driver.find_elements(By.CSS_SELECTOR, f"#{chart} .empty"), f"{chart}: no empty state ({text!r})"
        assert "no requests yet" in driver.find_element(By.ID, "recent").text
        assert driver.find_element(By.CSS_SELECTOR, "[data-key='overall.requests']").text == "0"
        errors = severe(driver)
        assert all("401" in e["message"] for e in errors), f"console errors: {errors}"
        driver.save_screenshot(SCREENSHOT.replace(".png", "-empty.png"))
        print("empty dashboard: every chart shows its empty state")

        loader.start()
        started = time.time()

        # Let the load run, then stop it so the window's counts freeze.
        time.sleep(max(0.0, LOAD_SECONDS - (time.time() - started)))
        stop.set()
        loader.join(timeout=60)
        frozen = api(admin, "/api/v1/summary")
        time.sleep(0.5)
        again = api(admin, "/api/v1/summary")
        assert frozen["overall"]["requests"] == again["overall"]["requests"], "load did not stop"
        n = frozen["overall"]["requests"]
        assert n > 0
        # The page catches up with the frozen window (it polls every 2 s), and the timeline
        # closes a 5 s slice with traffic in it.
        WebDriverWait(driver, 20).until(lambda d: (d.execute_script(
            "const s = window.goodputDashboard.summary; return s && s.overall.requests") == n))
        WebDriverWait(driver, 20).until(lambda d: all(
            d.find_elements(By.CSS_SELECTOR, f"#{c} svg[data-points]") for c in
            ("chart-goodput", "chart-ttft", "chart-tpot", "chart-itl", "chart-input", "chart-capacity")))
        time.sleep(0.3)
        summary = driver.execute_script("return window.goodputDashboard.summary")
        for key in ("requests", "slo_met", "slo_missed", "attainment", "output_tokens",
                    "effective_output_tokens"):
            assert summary["overall"][key] == frozen["overall"][key], \
                f"{key}: page {summary['overall'][key]} vs API {frozen['overall'][key]}"
        checked = check_numbers(driver, summary)
        shown = parse(driver.find_element(By.CSS_SELECTOR, "[data-key='overall.requests']").text)
        assert shown == n, f"page shows {shown} requests, /api/v1/summary has {n}"
        for chart in ("chart-goodput", "chart-ttft", "chart-tpot", "chart-itl", "chart-input", "chart-capacity"):
            svg = driver.find_element(By.CSS_SELECTOR, f"#{chart} svg")
            pts = int(svg.get_attribute("data-points"))
            assert pts > 0, f"{chart} is empty"
            assert svg.find_elements(By.CSS_SELECTOR, "path, rect, circle"), f"{chart} draws nothing"
        rows = driver.find_elements(By.CSS_SELECTOR, "#recent tr")
        assert len(rows) == min(50, n), f"{len(rows)} recent rows for {n} requests"
        classes = [r.get_attribute("data-class") for r in driver.find_elements(By.CSS_SELECTOR, "#classes tr")]
        assert classes == [c["name"] for c in frozen["classes"]], classes
        assert "drift detection is off" in driver.find_element(By.ID, "drift").text
        assert "engine metrics" in driver.find_element(By.ID, "attribution").text
        errors = severe(driver)
        assert not errors, f"console errors: {errors}"
        os.makedirs(os.path.dirname(SCREENSHOT) or ".", exist_ok=True)
        driver.save_screenshot(SCREENSHOT)
        print(f"dashboard: {n} requests, {checked} numbers equal /api/v1/summary, 6 charts drawn, "
              f"{len(rows)} recent rows, no console error; screenshot {SCREENSHOT}")
    finally:
        stop.set()
        if driver is not None:
            driver.quit()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)


if __name__ == "__main__":
    main()
