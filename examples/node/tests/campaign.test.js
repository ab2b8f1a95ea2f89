'use strict';
// Leader election with the Node client, against a real agent: campaign,
// elected terms, release of a term, resign, break, reconnects.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { after, before, describe, test } = require('node:test');

const { connect, Campaign, Lease, AgentError } = require('lockagent');
const { Agent, RawConn, waitFor } = require('./harness.js');

describe('campaign', () => {
  let agent;
  const clients = [];
  async function client(options = {}) {
    const c = await connect({ socket: agent.socket, client: 'node-campaign-test', ...options });
    clients.push(c);
    return c;
  }
  let seq = 0;
  const unique = () => `leader/${process.pid}-${++seq}`;

  before(async () => { agent = await Agent.start(); });
  after(async () => {
    await Promise.all(clients.map((c) => c.close()));
    await agent.stop();
  });

  test('one leader at a time; a released term passes leadership on', async () => {
    const [a, b] = [await client(), await client()];
    const name = unique();
    const ca = await a.campaign(name, { meta: 'a' });
    assert.ok(ca instanceof Campaign);
    assert.match(ca.id, /^c_/);
    const termA = await ca.elected({ signal: AbortSignal.timeout(5000) });
    assert.ok(termA instanceof Lease);
    assert.equal(termA.name, name);
    assert.equal(termA.mode, 'exclusive');
    assert.equal(termA.scope, 'connection');
    assert.equal(termA.meta, 'a');
    assert.equal(ca.leader, termA);
    assert.equal(await ca.elected(), termA, 'elected resolves at once while leading');

    const cb = await b.campaign(name, { meta: 'b' });
    const electedB = cb.elected({ signal: AbortSignal.timeout(5000) });
    const info = await b.inspect(name);
    assert.deepEqual(info.holders.map((h) => [h.token, h.meta]), [[termA.token, 'a']]);
    assert.equal(cb.leader, null);

    // Releasing a term ends that term only: b, queued first, leads next,
    // and a contends again.
    assert.equal(await termA.release(), true);
    const termB = await electedB;
    assert.ok(termB.token > termA.token);
    assert.equal(ca.leader, null);

    // Resigning gives leadership back to a.
    const electedA = ca.elected({ signal: AbortSignal.timeout(5000) });
    await cb.resign();
    assert.equal(cb.ended, true);
    assert.equal(termB.released, true);
    const termA2 = await electedA;
    assert.ok(termA2.token > termB.token);
    await assert.rejects(cb.elected(), { code: 'campaign_ended' });
    await cb.resign();
  });

  test('a broken term is lost, and the campaign is elected again', async () => {
    const a = await client();
    const name = unique();
    const c = await a.campaign(name);
    const elected = [];
    c.on('elected', (t) => elected.push(t));
    const term = await c.elected({ signal: AbortSignal.timeout(5000) });
    await agent.ctl('break', name);
    const err = await term.ended;
    assert.equal(err.reason, 'broken');
    const next = await waitFor(() => elected.find((t) => t !== term && t.held), { what: 'a new term' });
    assert.ok(next.token > term.token);
    assert.equal(c.leader, next);
  });

  test('errors: a second campaign for the same name, resign of an unknown campaign', async () => {
    const a = await client();
    const name = unique();
    await a.campaign(name);
    await assert.rejects(a.campaign(name), { name: 'AgentError', code: 'invalid_argument' });
    await assert.rejects(a.campaign('bad name'), { code: 'invalid_name' });
    const err = await a.request('resign', { campaign: 'c_nope' }).catch((e) => e);
    assert.ok(err instanceof AgentError);
    assert.equal(err.code, 'not_held');
  });

  test('an abort stops waiting for a term, not the campaign', async () => {
    const [a, b] = [await client(), await client()];
    const name = unique();
    const ca = await a.campaign(name);
    const termA = await ca.elected({ signal: AbortSignal.timeout(5000) });
    const cb = await b.campaign(name);
    await assert.rejects(cb.elected({ signal: AbortSignal.timeout(50) }), { name: 'TimeoutError' });
    await termA.release();
    assert.ok(await cb.elected({ signal: AbortSignal.timeout(5000) }));
  });

  test('after a broken connection the client campaigns again', async () => {
    const a = await client({ sessionTtlMs: 10000 });
    const name = unique();
    const c = await a.campaign(name);
    const term = await c.elected({ signal: AbortSignal.timeout(5000) });
    const oldId = c.id;
    const raw = await RawConn.connect(agent.socket);
    await raw.call({ id: 1, op: 'hello', resume: { session: a.session, token: a.resumeToken } });
    assert.equal((await term.ended).reason, 'disconnected');
    const next = await waitFor(() => c.leader, { what: 'a term after the reconnect' });
    assert.notEqual(c.id, oldId, 'a connection-scoped campaign is started again');
    assert.ok(next.token > term.token);
  });

  test('a resign while the campaign is started again after a reconnect ends it', async () => {
    const [a, b] = [await client(), await client()];
    const name = unique();
    const c = await a.campaign(name);
    await c.elected({ signal: AbortSignal.timeout(5000) });
    const resigned = new Promise((resolve) => {
      a.once('reconnect', () => queueMicrotask(() => resolve(c.resign())));
    });
    a._sock.destroy();
    await resigned;
    assert.equal(c.ended, true);
    await waitFor(async () => !(await b.inspect(name)).locked, { what: 'the name to be free' });
    assert.ok(await b.tryAcquire(name));
  });

  test('a session-scoped campaign is kept by a resumed session', async () => {
    const a = await client({ sessionTtlMs: 10000 });
    const name = unique();
    const c = await a.campaign(name, { scope: 'session' });
    const term = await c.elected({ signal: AbortSignal.timeout(5000) });
    assert.equal(term.scope, 'session');
    const oldId = c.id;
    const reconnected = new Promise((r) => a.once('reconnect', r));
    const raw = await RawConn.connect(agent.socket);
    await raw.call({ id: 1, op: 'hello', resume: { session: a.session, token: a.resumeToken } });
    assert.equal((await reconnected).resumed, true);
    assert.equal(c.id, oldId);
    assert.equal(term.held, true);
    assert.equal((await term.check()).held, true);
    await c.resign();
    assert.equal((await a.inspect(name)).locked, false);
  });

  test('close ends campaigns and frees the name', async () => {
    const [a, b] = [await client(), await client()];
    const name = unique();
    const c = await a.campaign(name);
    const term = await c.elected({ signal: AbortSignal.timeout(5000) });
    await a.close();
    assert.equal(c.ended, true);
    assert.equal(term.released, true);
    assert.ok(await b.tryAcquire(name));
  });
});

/**
 * An agent played by the test on a real socket, for what a real agent
 * cannot be made to do on demand: `answer(n, req)` gives the fields of the
 * answer to request `req` on the n-th connection (from 0), or null for
 * none; `after(n, req, sock)` may then act on the connection.
 */
function fakeAgent(answer, after = () => {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'la-fake-'));
  const socket = path.join(dir, 's');
  const ops = []; // by connection, the ops it read
  const server = net.createServer((sock) => {
    const n = ops.length;
    ops.push([]);
    let buf = '';
    sock.setEncoding('utf8');
    sock.on('error', () => {});
    sock.on('data', (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const req = JSON.parse(buf.slice(0, i));
        buf = buf.slice(i + 1);
        ops[n].push(req.op);
        const fields = req.op === 'hello'
          ? { session: `s${n}`, resume_token: 't', resumed: false, agent: { version: 'fake', backend: 'fake', max_line_bytes: 65536, ttl_ms: {} } }
          : answer(n, req);
        if (fields) sock.write(`${JSON.stringify({ id: req.id, ok: true, ...fields })}\n`);
        after(n, req, sock);
      }
    });
  });
  return {
    socket,
    ops,
    listen: () => new Promise((resolve) => server.listen(socket, resolve)),
    close: () => {
      server.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

test('a campaign started again after a reconnect, unanswered past timeoutMs, is started again on a new connection', { timeout: 20000 }, async () => {
  const agent = fakeAgent(
    // The second connection never answers the campaign.
    (n, req) => (req.op === 'campaign' && n !== 1 ? { campaign: `c${n}` } : null),
    // The first connection breaks once the campaign is under way.
    (n, req, sock) => { if (n === 0 && req.op === 'campaign') sock.destroy(); },
  );
  await agent.listen();
  const c = await connect({ socket: agent.socket, timeoutMs: 300, reconnectMinMs: 10 });
  try {
    const campaign = await c.campaign('fake/leader');
    await waitFor(() => agent.ops.length >= 3 && agent.ops[2].includes('campaign'),
      { timeoutMs: 10000, what: 'the campaign on a third connection' });
    assert.deepEqual(agent.ops[1], ['hello', 'campaign']);
    await waitFor(() => campaign.id === 'c2', { what: 'the campaign to take its new id' });
    assert.equal(campaign.ended, false);
  } finally {
    await c.close();
    agent.close();
  }
});
