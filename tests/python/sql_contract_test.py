#!/usr/bin/env python3
"""tenure's SQL contract from Python (psycopg 3), the way a Python service uses it.

Installs a throwaway schema with the `tenure` binary on the test cluster (TENURE_TEST_DSN),
creates one LOGIN role per `tenure grant-*` slice (producer, worker, finalizer, callback) and
makes every call as the role a real service would use for it. A business table lives in a schema
of its own beside tenure's. The schema, the business schema and the roles are dropped at the end.

usage: sql_contract_test.py TENURE_BINARY [unittest options]

docs/other_languages.md walks through the same calls.
"""
import os
import re
import secrets
import subprocess
import sys
import threading
import time
import unittest
from datetime import timedelta

try:
    import psycopg
    from psycopg import sql
    from psycopg.rows import dict_row
    from psycopg.types.json import Jsonb
except ImportError:  # fail, never skip
    sys.exit("sql_contract_test.py: psycopg 3 is missing (apt-get install python3-psycopg; scripts/setup does it)")

TOKEN_V2 = re.compile(r"tn2:[1-9][0-9]*:[1-9][0-9]*:[0-9a-f]{32}")
TENURE = ""  # the binary, from argv
GRANTS = ("producer", "worker", "finalizer", "callback")


class Install:
    """A tenure schema, a business schema beside it and one LOGIN role per grant, all throwaway."""

    def __init__(self, tenure, dsn):
        suffix = secrets.token_hex(5)
        self.tenure, self.dsn = tenure, dsn
        self.schema = "pyc_" + suffix
        self.app = "pyc_app_" + suffix
        self.roles = {g: f"pyc_{g}_{suffix}" for g in GRANTS}
        self.passwords = {g: secrets.token_urlsafe(18) for g in GRANTS}
        self.admin = None

    def cli(self, *args):
        out = subprocess.run([self.tenure, "--database-url", self.dsn, "--schema", self.schema, *args],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"tenure {' '.join(args)}: exit {out.returncode}: {out.stderr.strip()}")
        return out.stdout

    def up(self):
        self.admin = psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row)
        self.cli("migrate")
        for grant, role in self.roles.items():
            self.admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(self.passwords[grant])))
            self.cli("grant-" + grant, role)
        app, producer, finalizer = (sql.Identifier(n) for n in (self.app, self.roles["producer"],
                                                                 self.roles["finalizer"]))
        self.admin.execute(sql.SQL("CREATE SCHEMA {app}").format(app=app))
        self.admin.execute(sql.SQL("CREATE TABLE {app}.orders (ref text PRIMARY KEY, job_id bigint)").format(app=app))
        self.admin.execute(sql.SQL("GRANT USAGE ON SCHEMA {app} TO {p}, {f}").format(app=app, p=producer, f=finalizer))
        self.admin.execute(sql.SQL("GRANT SELECT, INSERT ON {app}.orders TO {p}, {f}").format(
            app=app, p=producer, f=finalizer))

    def connect(self, grant, autocommit=True):
        """A session of the service that holds `grant`, logged in as its own role."""
        return psycopg.connect(self.dsn, user=self.roles[grant], password=self.passwords[grant],
                               autocommit=autocommit, row_factory=dict_row)

    def down(self):
        admin = self.admin or psycopg.connect(self.dsn, autocommit=True)
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.app)))
        for role in self.roles.values():
            exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            if exists:
                admin.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
        admin.close()


class SqlContract(unittest.TestCase):
    """Each test uses a queue of its own (its name), so the tests share one schema."""

    @classmethod
    def setUpClass(cls):
        dsn = os.environ.get("TENURE_TEST_DSN")
        if not dsn:
            raise RuntimeError("TENURE_TEST_DSN is not set: this test needs the project's PostgreSQL")
        cls.install = Install(TENURE, dsn)
        try:
            cls.install.up()
            cls.admin = cls.install.admin
            cls.producer = cls.install.connect("producer")
            cls.worker = cls.install.connect("worker")
            cls.finalizer = cls.install.connect("finalizer")
            cls.callback = cls.install.connect("callback")
        except BaseException:
            cls.install.down()
            raise

    @classmethod
    def tearDownClass(cls):
        for name in ("producer", "worker", "finalizer", "callback"):
            conn = getattr(cls, name, None)
            if conn is not None:
                conn.close()
        cls.install.down()

    def setUp(self):
        self.queue = self._testMethodName

    # ---- helpers ----------------------------------------------------------------------------

    def q(self, text):
        """SQL with {t} for tenure's schema and {app} for the business schema."""
        return sql.SQL(text).format(t=sql.Identifier(self.install.schema), app=sql.Identifier(self.install.app))

    def enqueue(self, conn, kind, args=None, **named):
        """tenure.enqueue with named parameters; returns the job id."""
        params = {"kind": kind, "args": Jsonb(args if args is not None else {}), "queue": self.queue, **named}
        names = sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in params)
        query = sql.SQL("SELECT {t}.enqueue({names}) AS job_id").format(t=sql.Identifier(self.install.schema),
                                                                        names=names)
        return conn.execute(query, params).fetchone()["job_id"]

    def claim(self, n=1, worker_name="py-worker"):
        """The worker's claim: job_id, run_lease, kind, args, attempt, token, metadata per job."""
        return self.worker.execute(self.q("SELECT * FROM {t}.claim(%s, %s, %s)"),
                                   (self.queue, n, worker_name)).fetchall()

    def complete(self, conn, token, progress=None):
        return conn.execute(self.q("SELECT * FROM {t}.complete_job(%s, %s)"),
                            (token, Jsonb(progress) if progress is not None else None)).fetchall()

    def job(self, job_id):
        """A fresh read of the job (the schema owner's session), or None."""
        return self.admin.execute(self.q("SELECT * FROM {t}.jobs WHERE id = %s"), (job_id,)).fetchone()

    def orders(self, ref):
        return self.admin.execute(self.q("SELECT count(*) AS n FROM {app}.orders WHERE ref = %s"), (ref,)).fetchone()["n"]

    def refused(self, conn, query, params=()):
        """The psycopg error a statement raises; fails the test when it succeeds."""
        try:
            conn.execute(query, params)
        except psycopg.Error as e:
            return e
        self.fail(f"expected an error from {query.as_string(conn)}")

    def listen(self, channel):
        """A worker-role session LISTENing on `channel`; notifications collect in its list."""
        conn = self.install.connect("worker")
        got = []
        conn.add_notify_handler(lambda n: got.append((n.channel, n.payload)))
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        return conn, got

    @staticmethod
    def drain(conn, got, until=lambda got: False, timeout=5.0):
        """Round trips on `conn` (each delivers pending notifications) until `until(got)` or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            conn.execute("SELECT 1")
            if until(got) or time.monotonic() > deadline:
                return got
            time.sleep(0.005)

    # ---- producers: enqueue joins the caller's transaction ----------------------------------

    def test_enqueue_in_a_committed_business_transaction_makes_a_job_claimable_with_its_args_and_metadata(self):
        trace = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
        with self.producer.transaction():
            self.producer.execute(self.q("INSERT INTO {app}.orders (ref) VALUES ('A-1')"))
            job_id = self.enqueue(self.producer, "send_receipt", {"order": "A-1", "cents": 1250}, metadata=Jsonb(trace))
            self.assertIsNone(self.job(job_id), "an uncommitted job is invisible")
            self.assertEqual(self.claim(), [], "workers cannot claim an uncommitted job")
        self.assertEqual(self.job(job_id)["state"], "available")
        self.assertEqual(self.orders("A-1"), 1)

        [c] = self.claim()
        self.assertEqual(c["job_id"], job_id)
        self.assertEqual(c["kind"], "send_receipt")
        self.assertEqual(c["args"], {"order": "A-1", "cents": 1250})
        self.assertEqual(c["metadata"], trace)
        self.assertEqual(c["attempt"], 1)
        self.assertGreater(c["run_lease"], 0)
        self.assertRegex(c["token"], TOKEN_V2)
        self.assertTrue(c["token"].startswith(f"tn2:{job_id}:{c['run_lease']}:"), c["token"])
        self.assertEqual(self.job(job_id)["state"], "running")
        self.complete(self.worker, c["token"])

    def test_enqueue_in_a_rolled_back_business_transaction_never_existed(self):
        with self.assertRaises(ValueError):
            with self.producer.transaction():
                self.producer.execute(self.q("INSERT INTO {app}.orders (ref) VALUES ('A-2')"))
                job_id = self.enqueue(self.producer, "send_receipt", {"order": "A-2"})
                raise ValueError("card declined")  # the business step fails: the block rolls back
        self.assertIsNone(self.job(job_id))
        self.assertEqual(self.orders("A-2"), 0)
        self.assertEqual(self.claim(), [])

    def test_enqueue_batch_returns_one_id_per_job_in_input_order_and_is_all_or_nothing(self):
        kinds = ["first", "second", "third"]
        rows = self.producer.execute(
            self.q("SELECT ord, job_id FROM {t}.enqueue_batch(%s::text[], %s::jsonb[], %s::text[], %s::int[], "
                   "metadatas => %s::jsonb[])"),
            (kinds, [Jsonb({"n": i}) for i in range(3)], [self.queue] * 3, [2] * 3,
             [Jsonb({"tenant": "t1"})] * 3)).fetchall()
        self.assertEqual([r["ord"] for r in rows], [1, 2, 3])
        self.assertEqual(len({r["job_id"] for r in rows}), 3)
        for i, r in enumerate(rows):
            job = self.job(r["job_id"])
            self.assertEqual((job["kind"], job["args"], job["metadata"]), (kinds[i], {"n": i}, {"tenant": "t1"}))

        e = self.refused(self.producer, self.q("SELECT * FROM {t}.enqueue_batch(%s::text[], %s::jsonb[], %s::text[], "
                                               "%s::int[])"),
                         (["ok", "bad"], [Jsonb({}), Jsonb([1])], [self.queue] * 2, [2, 2]))
        self.assertEqual(e.sqlstate, "22023")
        self.assertIn("tenure.enqueue_batch: job 2: args must be a JSON object", e.diag.message_primary)
        kinds_now = self.admin.execute(self.q("SELECT count(*) AS n FROM {t}.jobs WHERE queue = %s"),
                                       (self.queue,)).fetchone()["n"]
        self.assertEqual(kinds_now, 3, "the refused batch added nothing")

    def test_copy_enqueue_moves_a_checked_stage_into_jobs_with_ids_in_ord_order_inside_the_transaction(self):
        with self.producer.transaction():
            self.producer.execute(self.q("INSERT INTO {app}.orders (ref) VALUES ('A-9')"))
            stage = self.producer.execute(self.q("SELECT {t}.enqueue_copy_stage() AS s")).fetchone()["s"]
            self.assertRegex(stage, r"^pg_temp\.tenure_enqueue_[0-9]+$")
            copy_sql = f"COPY {stage} (ord, kind, args, queue, priority, run_at, max_attempts, metadata) FROM STDIN"
            with self.producer.cursor().copy(copy_sql) as copy:
                for i in range(1, 1001):
                    copy.write_row((i, "bulk", f'{{"n": {i}}}', self.queue, 2, None, 25, '{"tenant": "t1"}'))
            ids = self.producer.execute(self.q("SELECT {t}.enqueue_copied() AS ids")).fetchone()["ids"]
            ids = [int(x) for x in ids.strip("{}").split(",")]
            self.assertEqual(len(ids), 1000)
            self.assertIsNone(self.job(ids[0]), "an uncommitted job is invisible")
        self.assertEqual(self.orders("A-9"), 1)
        for i in (0, 499, 999):
            job = self.job(ids[i])
            self.assertEqual((job["kind"], job["args"], job["metadata"], job["state"]),
                             ("bulk", {"n": i + 1}, {"tenant": "t1"}, "available"))

        # A row the stage refuses aborts the transaction: nothing of it stays.
        with self.assertRaises(psycopg.errors.CheckViolation) as refused:
            with self.producer.transaction():
                stage = self.producer.execute(self.q("SELECT {t}.enqueue_copy_stage() AS s")).fetchone()["s"]
                with self.producer.cursor().copy(f"COPY {stage} (ord, kind, args, queue, priority, run_at, "
                                                 "max_attempts, metadata) FROM STDIN") as copy:
                    copy.write_row((1, "ok", "{}", self.queue, 2, None, 25, "{}"))
                    copy.write_row((2, "bad", "[1]", self.queue, 2, None, 25, "{}"))
        self.assertIn("args must be a JSON object", str(refused.exception))
        n = self.admin.execute(self.q("SELECT count(*) AS n FROM {t}.jobs WHERE queue = %s"), (self.queue,)).fetchone()["n"]
        self.assertEqual(n, 1000)

        # Outside a transaction the COPY commits on its own and empties the stage: nothing to move.
        self.producer.execute(self.q("SELECT {t}.enqueue_copy_stage()"))
        with self.producer.cursor().copy(f"COPY {stage} (ord, kind, args, queue, priority, run_at, max_attempts, "
                                         "metadata) FROM STDIN") as copy:
            copy.write_row((1, "lost", "{}", self.queue, 2, None, 25, "{}"))
        self.assertIsNone(self.producer.execute(self.q("SELECT {t}.enqueue_copied() AS ids")).fetchone()["ids"])

    def test_copy_straight_into_specs_answers_the_ids_of_its_rows_in_input_order_inside_the_transaction(self):
        columns = "(kind, args, queue, priority, max_attempts, metadata)"
        with self.producer.transaction():
            self.producer.execute(self.q("INSERT INTO {app}.orders (ref) VALUES ('A-10')"))
            target = self.producer.execute(self.q("SELECT {t}.enqueue_copy_target(false) AS t")).fetchone()["t"]
            self.assertEqual(target, self.install.schema + ".specs")
            with self.producer.cursor().copy(f"COPY {target} {columns} FROM STDIN") as copy:
                for i in range(1, 1001):
                    copy.write_row(("direct", f'{{"n": {i}}}', self.queue, 2, 25, '{"tenant": "t2"}'))
            ids = self.producer.execute(self.q("SELECT {t}.enqueue_copied_ready(1000) AS ids")).fetchone()["ids"]
            ids = [int(x) for x in ids.strip("{}").split(",")]
            self.assertEqual(len(ids), 1000)
            self.assertIsNone(self.job(ids[0]), "an uncommitted job is invisible")
        self.assertEqual(self.orders("A-10"), 1)
        for i in (0, 499, 999):
            job = self.job(ids[i])
            self.assertEqual((job["kind"], job["args"], job["metadata"], job["state"], job["attempt"]),
                             ("direct", {"n": i + 1}, {"tenant": "t2"}, "available", 0))

        # A row a check of specs refuses aborts the transaction: nothing of it stays.
        with self.assertRaises(psycopg.errors.CheckViolation) as refused:
            with self.producer.transaction():
                with self.producer.cursor().copy(f"COPY {target} {columns} FROM STDIN") as copy:
                    copy.write_row(("ok", "{}", self.queue, 2, 25, "{}"))
                    copy.write_row(("bad", "{}", self.queue, 7, 25, "{}"))
        self.assertIn("priority must be 1..4", str(refused.exception))
        # Columns tenure sets itself are not the producer's to write.
        with self.assertRaises(psycopg.errors.InsufficientPrivilege):
            with self.producer.transaction():
                with self.producer.cursor().copy(f"COPY {target} (id, kind, queue) FROM STDIN") as copy:
                    copy.write_row((1, "forged", self.queue))
        n = self.admin.execute(self.q("SELECT count(*) AS n FROM {t}.jobs WHERE queue = %s AND kind <> 'direct'"),
                               (self.queue,)).fetchone()["n"]
        self.assertEqual(n, 0)

    def test_two_transactions_enqueueing_one_unique_key_make_one_job_and_a_new_one_after_completion(self):
        first = self.install.connect("producer", autocommit=False)
        second = self.install.connect("producer", autocommit=False)
        try:
            held = self.enqueue(first, "send_receipt", {"order": "U-1"}, unique_key="order:U-1")
            answered = []
            waiter = threading.Thread(target=lambda: answered.append(
                self.enqueue(second, "send_receipt", {"order": "U-1"}, unique_key="order:U-1")))
            waiter.start()
            time.sleep(0.1)  # the second transaction now waits for the first's key
            self.assertEqual(answered, [], "the second producer waits for the first transaction")
            first.commit()
            waiter.join(10)
            second.commit()
            self.assertEqual(answered, [held], "the second transaction got the holder's id")
        finally:
            first.close()
            second.close()
        rows = self.admin.execute(self.q("SELECT id, unique_key FROM {t}.jobs WHERE queue = %s"),
                                  (self.queue,)).fetchall()
        self.assertEqual(rows, [{"id": held, "unique_key": "order:U-1"}])
        [c] = self.claim()
        self.assertEqual(self.enqueue(self.producer, "send_receipt", unique_key="order:U-1"), held, "running: held")
        self.complete(self.worker, c["token"])
        renewed = self.enqueue(self.producer, "send_receipt", unique_key="order:U-1")
        self.assertNotEqual(renewed, held, "a completed job frees its key")
        rows = self.producer.execute(
            self.q("SELECT job_id, inserted FROM {t}.enqueue_batch(%s::text[], %s::jsonb[], %s::text[], %s::int[], "
                   "unique_keys => %s::text[]) ORDER BY ord"),
            (["a", "b"], [Jsonb({}), Jsonb({})], [self.queue] * 2, [2, 2], ["order:U-1", "order:U-2"])).fetchall()
        self.assertEqual(rows[0], {"job_id": renewed, "inserted": False})
        self.assertTrue(rows[1]["inserted"])

    def test_bad_enqueue_input_raises_22023_with_a_message_naming_the_field(self):
        cases = [
            ({"kind": ""}, "kind must be 1..255 printable characters"),
            ({"args": Jsonb([1, 2])}, "args must be a JSON object (got a JSON array)"),
            ({"args": Jsonb("text")}, "args must be a JSON object (got a JSON string)"),
            ({"priority": 0}, "priority must be between 1 (highest) and 4 (got 0)"),
            ({"priority": 5}, "priority must be between 1 (highest) and 4 (got 5)"),
            ({"queue": ""}, "queue must be 1..128 printable characters"),
            ({"max_attempts": 0}, "max_attempts must be at least 1 (got 0)"),
            ({"metadata": Jsonb({"k": "x" * 8184})}, "metadata must be at most 8192 bytes as JSON text (got 8193)"),
            ({"metadata": Jsonb(["trace"])}, "metadata must be a JSON object (got a JSON array)"),
        ]
        for change, message in cases:
            with self.subTest(change=list(change)):
                params = {"kind": "bad_input", "args": Jsonb({}), "queue": self.queue, **change}
                names = sql.SQL(", ").join(sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k))
                                           for k in params)
                e = self.refused(self.producer, sql.SQL("SELECT {t}.enqueue({names})").format(
                    t=sql.Identifier(self.install.schema), names=names), params)
                self.assertIsInstance(e, psycopg.errors.InvalidParameterValue)
                self.assertEqual(e.sqlstate, "22023")
                self.assertEqual(e.diag.message_primary, "tenure.enqueue: " + message)
        # 8192 bytes of metadata are accepted: the limit is exact.
        self.enqueue(self.producer, "at_limit", metadata=Jsonb({"k": "x" * 8183}))
        n = self.admin.execute(self.q("SELECT count(*) AS n FROM {t}.jobs WHERE kind = 'bad_input'")).fetchone()["n"]
        self.assertEqual(n, 0)

    # ---- workers and finalizers: the token ------------------------------------------------

    def test_complete_job_commits_together_with_the_business_row(self):
        job_id = self.enqueue(self.producer, "ship", {"order": "B-1"})
        [c] = self.claim()
        hb = self.worker.execute(self.q("SELECT {t}.heartbeat(%s) AS alive"), (c["token"],)).fetchone()
        self.assertTrue(hb["alive"])
        with self.finalizer.transaction():
            self.finalizer.execute(self.q("INSERT INTO {app}.orders (ref, job_id) VALUES ('B-1', %s)"), (job_id,))
            [done] = self.complete(self.finalizer, c["token"], {"tracking": "ZX-9"})
            self.assertEqual((done["job_id"], done["run_lease"]), (job_id, c["run_lease"]))
            self.assertIsNotNone(done["completed_at"])
            self.assertEqual(self.job(job_id)["state"], "running", "not completed before the commit")
            self.assertEqual(self.orders("B-1"), 0)
        job = self.job(job_id)
        self.assertEqual(job["state"], "completed")
        self.assertEqual(job["progress"], {"tracking": "ZX-9"})
        self.assertEqual(self.orders("B-1"), 1)

    def test_a_stale_completion_raises_tn001_and_its_business_row_never_commits(self):
        job_id = self.enqueue(self.producer, "ship", {"order": "C-1"})
        [old] = self.claim()
        # The worker stalls; the attempt is rescued and claimed again under a new run lease.
        rescued = self.worker.execute(self.q("SELECT {t}.rescue_stale(%s) AS n"), (timedelta(0),)).fetchone()["n"]
        self.assertGreaterEqual(rescued, 1)
        self.assertEqual(self.job(job_id)["state"], "available")
        [new] = self.claim()
        self.assertEqual(new["job_id"], job_id)
        self.assertGreater(new["run_lease"], old["run_lease"])
        self.assertNotEqual(new["token"], old["token"])

        with self.assertRaises(psycopg.Error) as caught:
            with self.finalizer.transaction():
                self.finalizer.execute(self.q("INSERT INTO {app}.orders (ref, job_id) VALUES ('C-1', %s)"), (job_id,))
                self.complete(self.finalizer, old["token"])
        e = caught.exception
        self.assertEqual(e.sqlstate, "TN001")
        self.assertEqual(e.diag.message_primary,
                         f"stale attempt: job {job_id} run lease {old['run_lease']} is no longer running")
        self.assertIn("must roll back", e.diag.message_hint)
        self.assertEqual(self.orders("C-1"), 0)

        # Without a transaction block: the error aborts the transaction on the server, so even a
        # commit afterwards keeps nothing (psycopg's commit of an aborted transaction rolls back).
        naive = self.install.connect("finalizer", autocommit=False)
        try:
            naive.execute(self.q("INSERT INTO {app}.orders (ref, job_id) VALUES ('C-2', %s)"), (job_id,))
            self.assertEqual(self.refused(naive, self.q("SELECT * FROM {t}.complete_job(%s)"),
                                          (old["token"],)).sqlstate, "TN001")
            naive.commit()
        finally:
            naive.close()
        self.assertEqual(self.orders("C-2"), 0)

        self.assertFalse(self.worker.execute(self.q("SELECT {t}.heartbeat(%s) AS alive"),
                                             (old["token"],)).fetchone()["alive"])
        job = self.job(job_id)
        self.assertEqual((job["state"], job["run_lease"]), ("running", new["run_lease"]), "the new attempt is untouched")
        self.complete(self.finalizer, new["token"])
        self.assertEqual(self.job(job_id)["state"], "completed")

    def test_malformed_tokens_raise_tn002_and_a_wrong_secret_raises_tn001_completing_nothing(self):
        job_id = self.enqueue(self.producer, "ship")
        [c] = self.claim()
        token = c["token"]
        secret = token.rsplit(":", 1)[1]
        malformed = {
            "NULL": None,
            "empty": "",
            "garbage": "garbage",
            "truncated": token[:-1],
            "uppercase secret": token[:-32] + secret.upper(),
            "oversized": "tn2:" + "1" * 80 + ":1:" + secret,
            "version 1": f"tn1:{job_id}:1",
            "unknown version": f"tn3:{job_id}:1:{secret}",
            "leading zero": f"tn2:0{job_id}:1:{secret}",
            "injection": "'; DROP TABLE x; --",
        }
        for what, bad in malformed.items():
            with self.subTest(token=what):
                e = self.refused(self.finalizer, self.q("SELECT * FROM {t}.complete_job(%s)"), (bad,))
                self.assertEqual(e.sqlstate, "TN002", e.diag.message_primary)
                self.assertTrue(e.diag.message_primary.startswith("malformed finalization token"),
                                e.diag.message_primary)
        e = self.refused(self.finalizer, self.q("SELECT * FROM {t}.complete_job(%s)"), (f"tn1:{job_id}:1",))
        self.assertIn("tn2", e.diag.message_hint, "the hint names the version to use")

        # Right shape, right attempt, wrong secret: exactly the stale answer (TN001), so a probe
        # learns nothing; heartbeat answers false.
        forged = token[:-1] + ("1" if token[-1] == "0" else "0")
        e = self.refused(self.finalizer, self.q("SELECT * FROM {t}.complete_job(%s)"), (forged,))
        self.assertEqual(e.sqlstate, "TN001")
        self.assertEqual(e.diag.message_primary,
                         f"stale attempt: job {job_id} run lease {c['run_lease']} is no longer running")
        self.assertEqual(self.refused(self.worker, self.q("SELECT {t}.fail_job(%s, 'x')"), (forged,)).sqlstate, "TN001")
        self.assertFalse(self.worker.execute(self.q("SELECT {t}.heartbeat(%s) AS alive"), (forged,)).fetchone()["alive"])

        job = self.job(job_id)
        self.assertEqual((job["state"], job["run_lease"], job["progress"]), ("running", c["run_lease"], None))
        self.complete(self.finalizer, token)
        self.assertEqual(self.job(job_id)["state"], "completed")

    def test_fail_job_with_the_token_retries_while_attempts_remain_then_fails(self):
        job_id = self.enqueue(self.producer, "flaky", max_attempts=2)
        [c] = self.claim()
        state = self.worker.execute(self.q("SELECT {t}.fail_job(%s, %s) AS state"), (c["token"], "timeout")).fetchone()
        self.assertEqual(state["state"], "retryable")
        job = self.job(job_id)
        self.assertEqual((job["state"], job["last_error"]), ("retryable", "timeout"))
        self.assertEqual(self.refused(self.worker, self.q("SELECT {t}.fail_job(%s, 'again')"),
                                      (c["token"],)).sqlstate, "TN001", "the attempt is closed")
        # The permanent form fails it at once, whatever attempts remain.
        other = self.enqueue(self.producer, "flaky")
        [c2] = self.claim()
        self.assertEqual(self.worker.execute(self.q("SELECT {t}.fail_job(%s, 'bad input', false) AS state"),
                                             (c2["token"],)).fetchone()["state"], "failed")
        self.assertEqual(self.job(other)["state"], "failed")

    # ---- the wake-up channel ------------------------------------------------------------------

    def test_the_wake_channel_carries_the_queue_name_only_while_a_worker_of_the_queue_sleeps(self):
        channel = self.install.schema + "_wake"
        listener, got = self.listen(channel)
        try:
            awake = self.enqueue(self.producer, "poke")  # no worker sleeps: no NOTIFY
            claim_sleep = self.q("SELECT * FROM {t}.claim_attempts(%s, 1, 'py-worker-1', 'sleep')")
            [first] = self.worker.execute(claim_sleep, (self.queue,)).fetchall()
            self.assertEqual(first["job_id"], awake)
            # An empty claim in 'sleep' mode registers the worker as sleeping, in the same statement.
            self.assertEqual(self.worker.execute(claim_sleep, (self.queue,)).fetchall(), [])
            woken = self.enqueue(self.producer, "poke")
            self.drain(listener, got, until=lambda got: len(got) >= 1)
            # Notifications arrive in commit order: one only, so the first enqueue sent none.
            self.assertEqual(got, [(channel, self.queue)])

            [c] = self.worker.execute(claim_sleep, (self.queue,)).fetchall()  # claims, and is awake again
            self.assertEqual(c["job_id"], woken)
            # claim_attempts returns the attempt's secret; the token is its portable text form.
            token = f"tn2:{c['job_id']}:{c['run_lease']}:{c['secret'].hex}"
            self.assertRegex(token, TOKEN_V2)
            self.complete(self.finalizer, token)
            self.assertEqual(self.job(woken)["state"], "completed")
            self.complete(self.finalizer, f"tn2:{first['job_id']}:{first['run_lease']}:{first['secret'].hex}")

            got.clear()
            self.enqueue(self.producer, "poke")  # nobody sleeps any more: no NOTIFY
            self.worker.execute(self.q("SELECT {t}.worker_idle(%s, 'py-worker-1')"), (self.queue,))
            self.enqueue(self.producer, "poke")
            self.drain(listener, got, until=lambda got: len(got) >= 1)
            self.assertEqual(got, [(channel, self.queue)])
            self.worker.execute(self.q("SELECT {t}.worker_busy(%s, 'py-worker-1')"), (self.queue,))
        finally:
            listener.close()

    # ---- external callbacks -------------------------------------------------------------------

    def start_waiting(self, **enqueue_args):
        """Enqueue, claim, register a callback and park the attempt on it, as a worker does."""
        job_id = self.enqueue(self.producer, "payment", {"invoice": 7}, **enqueue_args)
        [c] = self.claim()
        cb = self.worker.execute(self.q("SELECT {t}.register_callback(%s, %s, %s) AS id"),
                                 (c["job_id"], c["run_lease"], timedelta(hours=1))).fetchone()["id"]
        self.assertIsNotNone(cb)
        status = self.await_callback(c, cb)
        self.assertEqual(status, ("waiting", None))
        self.assertEqual(self.job(job_id)["state"], "waiting_external")
        return c, cb

    def await_callback(self, c, cb):
        row = self.worker.execute(self.q("SELECT status, payload FROM {t}.await_callback(%s, %s, %s)"),
                                  (c["job_id"], c["run_lease"], cb)).fetchone()
        return None if row is None else (row["status"], row["payload"])

    def callback_call(self, fn, *args):
        placeholders = sql.SQL(", ").join(sql.Placeholder() * len(args))
        query = sql.SQL("SELECT {t}.{fn}({args}) AS ok").format(t=sql.Identifier(self.install.schema),
                                                                fn=sql.Identifier(fn), args=placeholders)
        return self.callback.execute(query, args).fetchone()["ok"]

    def test_resume_callback_hands_its_payload_to_the_waiting_attempt_once(self):
        channel = self.install.schema + "_callback"
        listener, got = self.listen(channel)
        try:
            c, cb = self.start_waiting()
            # While the attempt waits, the callback owns it: its own token is stale.
            e = self.refused(self.finalizer, self.q("SELECT * FROM {t}.complete_job(%s)"), (c["token"],))
            self.assertEqual(e.sqlstate, "TN001")

            self.assertIs(self.callback_call("resume_callback", cb, Jsonb({"status": "paid"})), True)
            self.assertIs(self.callback_call("resume_callback", cb, Jsonb({"status": "paid twice"})), False)
            self.assertIs(self.callback_call("complete_callback", cb, None), False, "already resolved")
            self.drain(listener, got, until=lambda got: len(got) >= 1)
            self.assertEqual(got, [(channel, f"{c['job_id']}:{c['run_lease']}")])

            self.assertEqual(self.await_callback(c, cb), ("resumed", {"status": "paid"}))
            self.assertEqual(self.job(c["job_id"])["state"], "running")
            [done] = self.complete(self.finalizer, c["token"], {"paid": True})
            self.assertEqual(done["run_lease"], c["run_lease"], "the attempt ran on under the same run lease")
            self.assertEqual(self.job(c["job_id"])["state"], "completed")
        finally:
            listener.close()

    def test_complete_callback_finishes_the_job_once_and_a_second_completion_returns_false(self):
        c, cb = self.start_waiting()
        self.assertIs(self.callback_call("complete_callback", cb, Jsonb({"receipt": "R-1"})), True)
        job = self.job(c["job_id"])
        self.assertEqual((job["state"], job["progress"]), ("completed", {"receipt": "R-1"}))
        self.assertIs(self.callback_call("complete_callback", cb, Jsonb({"receipt": "R-2"})), False)
        self.assertIs(self.callback_call("fail_callback", cb, "late", False), False)
        self.assertIs(self.callback_call("resume_callback", cb, Jsonb({})), False)
        self.assertEqual(self.job(c["job_id"])["progress"], {"receipt": "R-1"}, "the second completion changed nothing")
        self.assertIsNone(self.await_callback(c, cb), "the worker's attempt is stale")
        self.assertEqual(self.refused(self.finalizer, self.q("SELECT * FROM {t}.complete_job(%s)"),
                                      (c["token"],)).sqlstate, "TN001")

    def test_fail_callback_retries_or_fails_the_job_once(self):
        c, cb = self.start_waiting(max_attempts=3)
        self.assertIs(self.callback_call("fail_callback", cb, "card declined", True), True)
        job = self.job(c["job_id"])
        self.assertEqual((job["state"], job["last_error"]), ("retryable", "card declined"))
        self.assertIs(self.callback_call("fail_callback", cb, "card declined", True), False)

        c2, cb2 = self.start_waiting(max_attempts=3)
        self.assertIs(self.callback_call("fail_callback", cb2, "fraud", False), True)  # retry defaults to false
        job = self.job(c2["job_id"])
        self.assertEqual((job["state"], job["last_error"]), ("failed", "fraud"))
        self.assertIs(self.callback_call("complete_callback", cb2, None), False)
        self.assertEqual(self.job(c2["job_id"])["state"], "failed")

    # ---- privileges ---------------------------------------------------------------------------

    def test_each_role_is_refused_42501_outside_its_grant(self):
        job_id = self.enqueue(self.producer, "guarded")
        [c] = self.claim()
        token = c["token"]
        refused = {
            "producer": ["SELECT * FROM {t}.claim('x')", "SELECT * FROM {t}.complete_job(%(token)s)",
                         "SELECT {t}.heartbeat(%(token)s)", "SELECT {t}.fail_job(%(token)s, 'x')",
                         "SELECT count(*) FROM {t}.jobs", "SELECT {t}.rescue_stale()",
                         "SELECT {t}.resume_callback(gen_random_uuid())"],
            "finalizer": ["SELECT {t}.enqueue('k')",
                          "SELECT * FROM {t}.enqueue_batch(ARRAY['k'], ARRAY['{{}}'::jsonb], ARRAY['q'], ARRAY[2])",
                          "SELECT * FROM {t}.claim('x')", "SELECT {t}.heartbeat(%(token)s)",
                          "SELECT {t}.fail_job(%(token)s, 'x')", "SELECT count(*) FROM {t}.jobs",
                          "SELECT count(*) FROM {t}.receipts", "SELECT {t}.cancel_job(%(job)s)"],
            "callback": ["SELECT {t}.enqueue('k')", "SELECT * FROM {t}.complete_job(%(token)s)",
                         "SELECT * FROM {t}.claim('x')", "SELECT count(*) FROM {t}.jobs"],
            "worker": ["SELECT {t}.enqueue('k')", "SELECT {t}.resume_callback(gen_random_uuid())",
                       "SELECT {t}.cancel_job(%(job)s)", "SELECT count(*) FROM {t}.receipts"],
        }
        for grant, statements in refused.items():
            conn = self.install.connect(grant)
            try:
                for statement in statements:
                    with self.subTest(role=grant, statement=statement):
                        e = self.refused(conn, self.q(statement), {"token": token, "job": job_id})
                        self.assertIsInstance(e, psycopg.errors.InsufficientPrivilege)
                        self.assertEqual(e.sqlstate, "42501")
            finally:
                conn.close()
        job = self.job(job_id)
        self.assertEqual((job["state"], job["run_lease"]), ("running", c["run_lease"]), "no refused call changed the job")
        self.complete(self.finalizer, token)


def main():
    global TENURE
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    TENURE = sys.argv.pop(1)
    unittest.main(verbosity=2)


if __name__ == "__main__":
    main()
