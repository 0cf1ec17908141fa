#!/usr/bin/env python3
"""tenure serve in a real browser: headless Chromium driven by Selenium against a real
`tenure serve` on the test cluster (TENURE_TEST_DSN), in a schema of its own.

Checks that the queue list shows the queues and counts the test made, that /jobs filters by
state, that a job whose args hold a <script> shows it as text and never runs it, and that the
retry button (with the token typed into the page) makes a failed job available again in the
database. Saves screenshots of /, /jobs and a job page.

usage: serve_browser_test.py TENURE_BINARY SCREENSHOT_DIR
"""
import os
import secrets
import subprocess
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

SCRIPT = "<script>window.__pwned=1</script>"


class Fixture:
    def __init__(self, tenure, dsn):
        self.tenure, self.dsn = tenure, dsn
        self.schema = "serve_" + secrets.token_hex(6)

    def cli(self, *args):
        out = subprocess.run([self.tenure, "--database-url", self.dsn, "--schema", self.schema, *args],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, f"tenure {args}: {out.stderr}"
        return out.stdout

    def sql(self, statement):
        out = subprocess.run(["psql", self.dsn, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", statement],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, f"psql: {out.stderr}"
        return out.stdout.strip()

    def enqueue(self, kind, queue, args="{}", *extra):
        return int(self.cli("enqueue", kind, "--queue", queue, "--args", args, *extra))


def main():
    tenure, shots = sys.argv[1], sys.argv[2]
    dsn = os.environ.get("TENURE_TEST_DSN")
    assert dsn, "TENURE_TEST_DSN is not set: this test needs the project's PostgreSQL"
    os.makedirs(shots, exist_ok=True)
    f = Fixture(tenure, dsn)
    f.cli("migrate")
    server = driver = None
    checks = 0
    try:
        s = f.schema
        # mail: 3 available (one with a script in its args), 1 completed; billing: 1 failed.
        f.enqueue("send_email", "mail", '{"to": "ada@example.com"}')
        hostile = f.enqueue("send_email", "mail", '{"note": "%s"}' % SCRIPT)
        f.enqueue("send_email", "mail", '{"to": "bob@example.com"}')
        f.enqueue("send_email", "mail", '{"to": "cy@example.com"}', "--priority", "1")
        f.sql(f"SELECT {s}.complete_batch(array_agg(c.job_id), array_agg(c.run_lease)) "
              f"FROM {s}.claim_attempts('mail', 1, 'worker-a') c")
        failed = f.enqueue("charge_card", "billing", '{"invoice": 42}', "--max-attempts", "1")
        assert f.sql(f"SELECT {s}.fail_attempt(c.job_id, c.run_lease, 'card declined', true) "
                     f"FROM {s}.claim_attempts('billing', 1, 'worker-b') c") == "failed"

        token = secrets.token_urlsafe(24)
        token_file = tempfile.NamedTemporaryFile("w", delete=False, prefix="tenure-token-")
        token_file.write(token + "\n")
        token_file.close()
        os.chmod(token_file.name, 0o600)
        server = subprocess.Popen([tenure, "--database-url", dsn, "--schema", s, "serve", "--listen",
                                   "127.0.0.1:0", "--token-file", token_file.name],
                                  stdout=subprocess.PIPE, text=True)
        first = server.stdout.readline()
        os.unlink(token_file.name)
        assert first.startswith("tenure serve: http://127.0.0.1:"), first
        base = first.split()[2].rstrip("/")

        o = webdriver.ChromeOptions()
        for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,760"]:
            o.add_argument(a)
        driver = webdriver.Chrome(options=o)
        wait = WebDriverWait(driver, 20)  # generous: CI runs tests two at a time

        # / : queues with their counts per state.
        driver.get(base + "/")
        def count(queue, state):
            return driver.find_element(
                By.CSS_SELECTOR, f'tr[data-queue="{queue}"] td[data-state="{state}"]').text
        assert count("mail", "available") == "3", count("mail", "available")
        assert count("mail", "completed") == "1"
        assert count("billing", "failed") == "1"
        assert driver.find_element(By.CSS_SELECTOR, 'tr[data-queue="billing"] td.running').text == "running"
        assert "1 completed" in driver.find_element(By.TAG_NAME, "figcaption").text
        driver.save_screenshot(os.path.join(shots, "queues.png"))
        checks += 1

        # /jobs, filtered by state through the form.
        driver.get(base + "/jobs")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) == 5
        Select(driver.find_element(By.ID, "state")).select_by_value("failed")
        driver.find_element(By.ID, "apply").click()
        wait.until(EC.url_contains("state=failed"))
        rows = driver.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")
        assert [r.get_attribute("data-id") for r in rows] == [str(failed)], [r.text for r in rows]
        assert "card declined" in rows[0].text
        driver.get(base + "/jobs")
        driver.save_screenshot(os.path.join(shots, "jobs.png"))
        checks += 1

        # A job whose args hold a script: shown as text, never run.
        driver.get(f"{base}/jobs/{hostile}")
        assert SCRIPT in driver.find_element(By.ID, "args").text, driver.find_element(By.ID, "args").text
        assert driver.execute_script("return typeof window.__pwned") == "undefined"
        checks += 1

        # Retry a failed job from its page, with the token typed in; the database says available.
        driver.get(f"{base}/jobs/{failed}")
        assert driver.find_element(By.ID, "state").text == "failed"
        driver.find_element(By.ID, "token").send_keys(token)
        driver.find_element(By.CSS_SELECTOR, "#token-form button").click()
        wait.until(EC.text_to_be_present_in_element((By.ID, "token-state"), "token set"))
        driver.find_element(By.ID, "retry").click()
        wait.until(EC.text_to_be_present_in_element((By.ID, "message"), "will run again"))
        assert f.sql(f"SELECT state || ' ' || attempt FROM {s}.jobs WHERE id = {failed}") == "available 0"
        wait.until(EC.text_to_be_present_in_element((By.ID, "state"), "available"))  # the page reloads
        driver.get(f"{base}/jobs/{hostile}")
        driver.save_screenshot(os.path.join(shots, "job.png"))
        checks += 1
    finally:
        if driver:
            driver.quit()
        if server:
            server.terminate()
            server.wait(timeout=10)
        f.sql(f"DROP SCHEMA IF EXISTS {f.schema} CASCADE")
    print(f"{checks} passed, 0 failed")


if __name__ == "__main__":
    main()
