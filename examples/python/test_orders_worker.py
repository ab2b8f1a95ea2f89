"""Tests of the orders worker example against a real agent and SQLite."""

import os
import subprocess
import sys
import threading

import lockagent
import orders_worker
from harness import HERE, AgentTestCase, clean_env


class OrdersWorkerTest(AgentTestCase):
    def setUp(self):
        super().setUp()
        self.db_path = os.path.join(self.agent.dir, "orders.db")
        self.db = orders_worker.open_db(self.db_path)
        self.addCleanup(self.db.close)

    def row(self, order_id):
        return self.db.execute("SELECT status, total, worker, fence FROM orders WHERE id = ?",
                               (order_id,)).fetchone()

    def test_a_stale_holder_cannot_write(self):
        orders_worker.create_orders(self.db, 1)
        a, b = self.client(), self.client()
        stale = a.acquire("orders/1")
        orders_worker.fenced_write(self.db, 1, stale.token, status="processing", worker="a")
        # A's lock is broken while A is paused; B takes the order over.
        out = self.agent.ctl("break", "orders/1")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(orders_worker.process_order(b, self.db, 1, "b"))
        self.assertEqual(self.row(1)[:3], ("done", 1200, "b"))
        # A wakes up and writes with the token it had, without looking at
        # its lease: the database refuses it, and the order stays B's.
        with self.assertRaises(orders_worker.StaleToken):
            orders_worker.fenced_write(self.db, 1, stale.token, status="done", total=1,
                                       worker="a")
        status, total, worker, fence = self.row(1)
        self.assertEqual((status, total, worker), ("done", 1200, "b"))
        self.assertGreater(fence, stale.token)
        self.assertTrue(stale.lost)

    def test_a_worker_that_lost_its_lock_stops_and_the_next_one_finishes(self):
        orders_worker.create_orders(self.db, 1)
        a, b = self.client(), self.client()
        paused, resume = threading.Event(), threading.Event()

        def slow_work(amount):
            paused.set()
            self.assertTrue(resume.wait(10))
            return -1

        box = {}

        def run_a():
            db = orders_worker.open_db(self.db_path)
            try:
                orders_worker.process_order(a, db, 1, "a", work=slow_work)
            except Exception as e:
                box["error"] = e
            finally:
                db.close()
        t = threading.Thread(target=run_a)
        t.start()
        self.addCleanup(t.join, 10)
        self.assertTrue(paused.wait(10))
        self.assertEqual(self.row(1)[0], "processing")
        self.assertEqual(self.agent.ctl("break", "orders/1").returncode, 0)
        self.assertTrue(orders_worker.process_order(b, self.db, 1, "b"))
        resume.set()
        t.join(10)
        self.assertIsInstance(box["error"], lockagent.LeaseLost)
        self.assertEqual(self.row(1)[:3], ("done", 1200, "b"))

    def test_workers_in_parallel_process_every_order_once(self):
        orders_worker.create_orders(self.db, 40)
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "orders_worker.py"),
                                   "--db", self.db_path, "--worker", "w%d" % i],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=clean_env(LOCKAGENT_SOCKET=self.agent.socket))
                 for i in range(3)]
        done = 0
        for p in procs:
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0, err)
            done += int(out.split("processed ")[1].split()[0])
        self.assertEqual(done, 40)
        rows = self.db.execute("SELECT status, total, amount, fence FROM orders").fetchall()
        self.assertEqual(len(rows), 40)
        for status, total, amount, fence in rows:
            self.assertEqual((status, total), ("done", amount + amount // 5))
            self.assertGreater(fence, 0)
