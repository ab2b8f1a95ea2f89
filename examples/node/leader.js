#!/usr/bin/env node
'use strict';
// A service that runs a periodic job only while it is the leader.
//
// Start it several times, on one host (or on several, with the Redis
// backend): every instance campaigns for the same name, and only the one
// elected runs the job. When its term ends (the lock is broken, or
// renewals fail for too long) it stops at once and campaigns again; when
// the leader dies, another instance is elected. SIGTERM or SIGINT resigns
// and exits.
//
//   LOCKAGENT_SOCKET=/tmp/lockagent.sock node leader.js [NAME] [PERIOD_MS]

const { connect } = require('lockagent');

const name = process.argv[2] || 'jobs/report';
const periodMs = Number(process.argv[3] || 1000);

/**
 * The periodic job. It receives the term's fencing token, to hand to what
 * it writes to (so that a deposed leader's late write is refused), and the
 * term's signal, which aborts the moment the term ends.
 */
async function runJob(token, signal) {
  signal.throwIfAborted();
  console.log(`job ran token=${token}`);
}

async function main() {
  const stop = new AbortController();
  for (const sig of ['SIGTERM', 'SIGINT']) process.once(sig, () => stop.abort());

  const client = await connect({ client: `leader example, pid ${process.pid}`, heartbeatMs: 3000 });
  client.on('disconnect', () => console.log('disconnected from the agent, reconnecting'));
  let campaign;
  try {
    campaign = await client.campaign(name, { meta: `pid ${process.pid}` });
    console.log(`campaigning for ${name}`);
    while (!stop.signal.aborted) {
      let term;
      try {
        term = await campaign.elected({ signal: stop.signal });
      } catch (err) {
        if (stop.signal.aborted) break;
        throw err;
      }
      console.log(`elected token=${term.token}`);
      // Said the moment the term is lost, before any code that waits on
      // the term goes on.
      term.once('lost', (err) => console.log(`term lost reason=${err.reason}`));
      await lead(term, stop.signal);
    }
  } finally {
    await campaign?.resign();
    await client.close();
    console.log('stopped');
  }
}

/** Runs the job every periodMs, for as long as the term lasts. */
async function lead(term, stop) {
  while (term.held && !stop.aborted) {
    try {
      await runJob(term.token, term.signal);
    } catch (err) {
      if (!term.held) return; // the term ended during the job
      console.error(`job failed: ${err.message}`);
    }
    await sleep(periodMs, [term.signal, stop]);
  }
}

/** Resolves after ms, or as soon as one of signals aborts. */
function sleep(ms, signals) {
  return new Promise((resolve) => {
    if (signals.some((s) => s.aborted)) {
      resolve();
      return;
    }
    const done = () => {
      clearTimeout(timer);
      for (const s of signals) s.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    for (const s of signals) s.addEventListener('abort', done, { once: true });
  });
}

main().catch((err) => {
  console.error(`leader: ${err.message}`);
  process.exitCode = 1;
});
