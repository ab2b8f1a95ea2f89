"""A worker that processes orders under per-order locks, with fenced writes.

Each order is processed by one worker at a time: the worker holds the lock
``orders/ID`` while it works, and every write it makes to the database
carries the lock's fencing token. The database keeps, for each order, the
largest token that has written it, and an UPDATE refuses a smaller one in
the same statement that writes. So a worker that lost its lock without
noticing (paused by a long GC, swapping, SIGSTOP; or its lock broken)
cannot overwrite the work of the worker that holds the lock now.

    python3 orders_worker.py --db orders.db --init 20     # 20 pending orders
    python3 orders_worker.py --db orders.db --worker w1 &  # run several workers
    python3 orders_worker.py --db orders.db --worker w2

The agent is found through LOCKAGENT_SOCKET or the default path.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from typing import Callable, Optional

import lockagent

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    id          INTEGER PRIMARY KEY,
    amount      INTEGER NOT NULL,               -- in cents
    status      TEXT NOT NULL DEFAULT 'pending', -- pending, processing, done
    total       INTEGER,                        -- amount with tax, once done
    worker      TEXT,                           -- who wrote last
    fence       INTEGER NOT NULL DEFAULT 0      -- largest fencing token that wrote the row
);
"""


class StaleToken(Exception):
    """The database refused a write: a newer lock holder has written the order."""


def open_db(path: str) -> sqlite3.Connection:
    """Open the orders database, creating the table if needed.

    Autocommit mode: every transaction is explicit.
    """
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute(SCHEMA)
    return db


def create_orders(db: sqlite3.Connection, count: int) -> None:
    """Add ``count`` pending orders."""
    db.execute("BEGIN IMMEDIATE")
    db.executemany("INSERT INTO orders (amount) VALUES (?)",
                   [(1000 + 7 * i,) for i in range(count)])
    db.execute("COMMIT")


def fenced_write(db: sqlite3.Connection, order_id: int, token: int, **columns: object) -> None:
    """Write ``columns`` of an order, unless a larger token has written it.

    The check and the write are one UPDATE in one transaction: no other
    writer can come in between. Equal tokens pass, so that the holder of a
    lock can write several times. Raises :class:`StaleToken` if refused.
    """
    sets = ", ".join("%s = ?" % column for column in columns)
    db.execute("BEGIN IMMEDIATE")
    try:
        cur = db.execute("UPDATE orders SET %s, fence = ? WHERE id = ? AND fence <= ?" % sets,
                         list(columns.values()) + [token, order_id, token])
        if cur.rowcount != 1:
            row = db.execute("SELECT fence FROM orders WHERE id = ?", (order_id,)).fetchone()
            raise StaleToken("order %d: token %d refused, token %s has written it"
                             % (order_id, token, row[0] if row else "(no such order)"))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def compute_total(amount: int) -> int:
    """The work done under the lock: here, adding 20% tax."""
    return amount + amount // 5


def process_order(client: lockagent.Client, db: sqlite3.Connection, order_id: int, worker: str,
                  wait: float = 0, work: Callable[[int], int] = compute_total) -> bool:
    """Process one order under its lock. Returns True if this call did it.

    ``wait``: seconds to wait for the lock (0: skip an order another worker
    holds). Raises :class:`lockagent.LeaseLost` if the lock was lost before
    the final write, and :class:`StaleToken` if the database refused it.
    """
    try:
        lease = client.acquire("orders/%d" % order_id, wait=wait, meta=worker)
    except lockagent.NotAcquired:
        return False
    with lease:
        (status, amount) = db.execute("SELECT status, amount FROM orders WHERE id = ?",
                                      (order_id,)).fetchone()
        if status == "done":
            return False
        # Claim the order: from now on, older tokens cannot write it.
        fenced_write(db, order_id, lease.token, status="processing", worker=worker)
        total = work(amount)
        # Stop if the lock is known to be lost; the fence covers the rest.
        lease.raise_if_lost()
        fenced_write(db, order_id, lease.token, status="done", total=total, worker=worker)
    return True


def run_worker(client: lockagent.Client, db: sqlite3.Connection, worker: str) -> int:
    """Process orders until none is left; returns how many this worker did.

    A first pass skips the orders other workers hold; the next ones wait
    for their locks, and find them done or take over an abandoned one.
    """
    done = 0
    wait = 0.0
    while True:
        left = [row[0] for row in db.execute("SELECT id FROM orders WHERE status != 'done' "
                                             "ORDER BY id")]
        if not left:
            return done
        for order_id in left:
            if process_order(client, db, order_id, worker, wait=wait):
                done += 1
        wait = 10


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", required=True, help="the SQLite database")
    parser.add_argument("--init", type=int, metavar="N", help="create N pending orders and exit")
    parser.add_argument("--worker", default="worker", help="this worker's name")
    parser.add_argument("--socket", help="the agent's socket (default: LOCKAGENT_SOCKET, "
                                         "then the default path)")
    args = parser.parse_args(argv)
    db = open_db(args.db)
    if args.init:
        create_orders(db, args.init)
        return 0
    with lockagent.Client(args.socket, client="orders-worker " + args.worker) as client:
        done = run_worker(client, db, args.worker)
    print("%s: processed %d orders" % (args.worker, done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
