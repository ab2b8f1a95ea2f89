'use strict';
// The leader example, run as real processes against a real agent: one
// instance runs the job at a time; a broken term stops it; a dead leader is
// replaced; SIGTERM resigns.

const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const { after, before, test } = require('node:test');

const { Agent, cleanEnv, waitFor } = require('./harness.js');

const example = path.join(__dirname, '..', 'leader.js');
const NAME = 'jobs/report';

/** A running instance of the example, with its output as lines. */
class Instance {
  constructor(socket) {
    this.lines = [];
    this.proc = spawn(process.execPath, [example, NAME, '20'], {
      env: cleanEnv({ LOCKAGENT_SOCKET: socket }),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let buf = '';
    this.proc.stdout.setEncoding('utf8');
    this.proc.stdout.on('data', (d) => {
      buf += d;
      const parts = buf.split('\n');
      buf = parts.pop();
      this.lines.push(...parts);
    });
    this.stderr = '';
    this.proc.stderr.on('data', (d) => { this.stderr += d; });
    this.exited = false;
    this.exit = new Promise((resolve) => this.proc.on('exit', (code, signal) => {
      this.exited = true;
      resolve({ code, signal });
    }));
  }

  /** Throws if the instance has exited on its own. */
  assertRunning() {
    if (this.exited) throw new Error(`the example exited: ${this.stderr}`);
  }

  /** The tokens of the terms this instance was elected to, in order. */
  terms() { return this.matches(/^elected token=(\d+)$/); }

  /** The tokens the job ran with, in order. */
  jobs() { return this.matches(/^job ran token=(\d+)$/); }

  matches(re) {
    return this.lines.map((l) => re.exec(l)).filter(Boolean).map((m) => Number(m[1]));
  }
}

let agent;
const instances = [];
before(async () => { agent = await Agent.start(); });
after(async () => {
  for (const i of instances) i.proc.kill('SIGKILL');
  await agent.stop();
});

test('the leader example runs its job on one instance at a time', async () => {
  const a = new Instance(agent.socket);
  const b = new Instance(agent.socket);
  instances.push(a, b);
  const leaderOf = () => {
    a.assertRunning();
    b.assertRunning();
    return [a, b].find((i) => i.terms().length > 0);
  };

  // One is elected and runs the job with its term's token; the other waits.
  const first = await waitFor(leaderOf, { what: 'a leader', timeoutMs: 10000 });
  const other = first === a ? b : a;
  const [t1] = first.terms();
  await waitFor(() => first.jobs().length >= 3, { what: 'the job to run' });
  assert.ok(first.jobs().every((t) => t === t1));
  await waitFor(() => other.lines.includes(`campaigning for ${NAME}`), { what: 'the other to campaign' });
  assert.deepEqual(other.terms(), []);
  assert.deepEqual(other.jobs(), []);

  // Break the term: the leader stops at once, and a new term begins, with a
  // larger token, on one of them.
  await agent.ctl('break', NAME);
  await waitFor(() => first.lines.includes('term lost reason=broken'), { what: 'the term to be lost' });
  const jobsAtLoss = first.lines.indexOf('term lost reason=broken');
  assert.ok(first.lines.slice(jobsAtLoss).every((l) => l !== `job ran token=${t1}`),
    'no job runs after the term is lost');
  const second = await waitFor(() => [a, b].find((i) => i.terms().some((t) => t > t1)), { what: 'a second term' });
  const t2 = second.terms().at(-1);
  const standby = second === a ? b : a;
  const standbyTerms = standby.terms().length;

  // Kill the leader outright: the standby is elected.
  second.proc.kill('SIGKILL');
  await second.exit;
  await waitFor(() => standby.terms().length > standbyTerms, { what: 'the standby to be elected' });
  const t3 = standby.terms().at(-1);
  assert.ok(t3 > t2);
  await waitFor(() => standby.jobs().includes(t3), { what: 'the new leader to run the job' });

  // SIGTERM: the leader resigns, closes and exits cleanly, freeing the name.
  standby.proc.kill('SIGTERM');
  assert.deepEqual(await standby.exit, { code: 0, signal: null }, standby.stderr);
  assert.equal(standby.lines.at(-1), 'stopped');
  assert.match(await agent.ctl('inspect', NAME), /^jobs\/report: free /);
});
