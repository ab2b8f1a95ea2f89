'use strict';
// The Node client against a real agent process: every op, the lost signal,
// heartbeats, reconnect and resume, errors.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { after, before, describe, test } = require('node:test');

const lockagent = require('lockagent');
const { Agent, RawConn, cleanEnv, waitFor } = require('./harness.js');

const { connect, LockAgentError, AgentError, ConnectionError, LeaseLostError } = lockagent;

describe('socket path', () => {
  test('the default path is computed as the agent computes it', () => {
    const def = lockagent.defaultSocketPath;
    assert.equal(def({}, 0), '/run/lockagent/agent.sock');
    assert.equal(def({ INVOCATION_ID: 'x' }, 1000), '/run/lockagent/agent.sock');
    assert.equal(def({ NOTIFY_SOCKET: '/run/systemd/notify' }, 1000), '/run/lockagent/agent.sock');
    assert.equal(def({ XDG_RUNTIME_DIR: '/run/user/1000' }, 1000), '/run/user/1000/lockagent.sock');
    assert.equal(def({ XDG_RUNTIME_DIR: 'relative/dir' }, 1000), '/tmp/lockagent-1000/agent.sock');
    assert.equal(def({ TMPDIR: '/var/tmp' }, 1000), '/var/tmp/lockagent-1000/agent.sock');
    assert.equal(def({}, 1000), '/tmp/lockagent-1000/agent.sock');
  });

  test('a socket in lockagent-UID in the temporary directory is used only if that directory is private', async () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'la-private-'));
    const saved = process.env.TMPDIR;
    process.env.TMPDIR = tmp;
    try {
      const dir = path.join(tmp, `lockagent-${process.geteuid()}`);
      fs.mkdirSync(dir);
      fs.chmodSync(dir, 0o777);
      const socket = path.join(dir, 'agent.sock');
      await assert.rejects(connect({ socket }), /not a directory private/);
      fs.chmodSync(dir, 0o700);
      // Private: it connects, to nobody.
      await assert.rejects(connect({ socket }), (err) => err instanceof ConnectionError && err.code === 'connect_failed' && err.cause.code === 'ENOENT');
    } finally {
      if (saved === undefined) delete process.env.TMPDIR; else process.env.TMPDIR = saved;
      fs.rmSync(tmp, { recursive: true });
    }
  });

  test('an explicit path wins over LOCKAGENT_SOCKET, which wins over the default', () => {
    const env = { LOCKAGENT_SOCKET: '/srv/la.sock', XDG_RUNTIME_DIR: '/run/user/1' };
    assert.equal(lockagent.socketPath('/x.sock', env), '/x.sock');
    assert.equal(lockagent.socketPath(undefined, env), '/srv/la.sock');
    assert.equal(lockagent.socketPath(undefined, { LOCKAGENT_SOCKET: '' }), lockagent.defaultSocketPath({}));
  });
});

describe('the package', () => {
  test('its declarations declare every name the module exports, and only those', () => {
    // The declarations of the copy under test: beside the module, as the package ships them.
    const dts = fs.readFileSync(require.resolve('lockagent').replace(/\.js$/, '.d.ts'), 'utf8');
    const declared = [...dts.matchAll(/^export declare (?:const|function|class) (\w+)/gm)].map((m) => m[1]);
    assert.deepEqual(declared.sort(), Object.keys(lockagent).sort());
  });
});

describe('against an agent', () => {
  let agent;
  const clients = [];
  /** A connected client on the shared agent, closed after the tests. */
  async function client(options = {}) {
    const c = await connect({ socket: agent.socket, client: 'node-test', ...options });
    clients.push(c);
    return c;
  }
  let seq = 0;
  const unique = (kind) => `${kind}/${process.pid}-${++seq}`;

  before(async () => { agent = await Agent.start(); });
  after(async () => {
    await Promise.all(clients.map((c) => c.close()));
    await agent.stop();
  });

  test('connect finds the agent through LOCKAGENT_SOCKET and says hello', async () => {
    const saved = process.env.LOCKAGENT_SOCKET;
    process.env.LOCKAGENT_SOCKET = agent.socket;
    let c;
    try {
      c = await connect({ client: 'env-client' });
    } finally {
      if (saved === undefined) delete process.env.LOCKAGENT_SOCKET;
      else process.env.LOCKAGENT_SOCKET = saved;
    }
    clients.push(c);
    assert.equal(c.socketPath, agent.socket);
    assert.match(c.session, /^s_/);
    assert.ok(c.resumeToken.length > 10);
    assert.equal(c.connected, true);
    assert.equal(c.agent.backend, 'memory');
    assert.equal(c.agent.maxLineBytes, 65536);
    assert.deepEqual(c.agent.ttlMs, { default: 15000, min: 1000, max: 86400000 });
    const sessions = await c.list();
    const mine = sessions.find((s) => s.session === c.session);
    assert.equal(mine.client, 'env-client');
    assert.equal(mine.pid, process.pid);
  });

  test('connecting to a socket nobody listens on fails with a ConnectionError, the system error its cause', async () => {
    await assert.rejects(connect({ socket: path.join(agent.dir, 'nobody.sock') }), (err) => err instanceof ConnectionError &&
      err instanceof LockAgentError && err.code === 'connect_failed' && err.cause.code === 'ENOENT');
  });

  test('try, wait with a deadline and wait until granted', async () => {
    const [a, b] = [await client(), await client()];
    const name = unique('orders');
    const first = await a.tryAcquire(name, { meta: 'invoice run' });
    assert.ok(first);
    assert.equal(first.name, name);
    assert.equal(first.mode, 'exclusive');
    assert.equal(first.scope, 'connection');
    assert.equal(first.meta, 'invoice run');
    assert.equal(first.ttlMs, 15000);
    assert.match(first.id, /^l_/);
    assert.ok(Number.isSafeInteger(first.token) && first.token > 0);
    assert.equal(first.held, true);
    assert.deepEqual(a.leases, [first]);

    assert.equal(await b.tryAcquire(name), null);
    const started = Date.now();
    assert.equal(await b.acquire(name, { waitMs: 150 }), null);
    assert.ok(Date.now() - started >= 140, 'waitMs waited');

    const waiting = b.acquire(name);
    await waitFor(async () => (await b.list()).find((s) => s.session === b.session).waiting.length === 1,
      { what: 'the acquire to wait' });
    assert.equal(await first.release(), true);
    assert.equal(first.released, true);
    assert.equal(first.held, false);
    assert.equal(await first.ended, null);
    assert.equal(first.signal.aborted, true);
    assert.equal(first.signal.reason.code, 'lease_released');
    const second = await waiting;
    assert.ok(second.token > first.token, 'tokens increase');
    assert.equal(await first.release(), false, 'a second release is a no-op');
  });

  test('shared locks, with a limit', async () => {
    const [a, b, c] = [await client(), await client(), await client()];
    const name = unique('sem');
    const l1 = await a.tryAcquire(name, { mode: 'shared', limit: 2 });
    const l2 = await b.tryAcquire(name, { mode: 'shared', limit: 2 });
    assert.equal(l1.mode, 'shared');
    assert.equal(l2.mode, 'shared');
    assert.equal(await c.tryAcquire(name, { mode: 'shared', limit: 2 }), null, 'the limit is reached');
    assert.equal(await c.tryAcquire(name), null, 'exclusive is denied while shared holders live');
    const info = await c.inspect(name);
    assert.equal(info.locked, true);
    assert.equal(info.mode, 'shared');
    assert.deepEqual(info.holders.map((h) => h.token), [l1.token, l2.token]);
    await l1.release();
    const l3 = await c.tryAcquire(name, { mode: 'shared', limit: 2 });
    assert.ok(l3);
  });

  test('inspect and list show meta, holders and tokens', async () => {
    const a = await client({ client: 'inspector' });
    const name = unique('inv');
    const never = await a.inspect(unique('never'));
    assert.deepEqual(never, { locked: false, mode: null, holders: [], lastToken: 0, queued: 0 });
    const lease = await a.tryAcquire(name, { meta: 'nightly report', ttlMs: 5000 });
    const info = await a.inspect(name);
    assert.equal(info.locked, true);
    assert.equal(info.mode, 'exclusive');
    assert.equal(info.lastToken, lease.token);
    assert.equal(info.holders.length, 1);
    const [h] = info.holders;
    assert.equal(h.token, lease.token);
    assert.equal(h.meta, 'nightly report');
    assert.equal(typeof h.host, 'string');
    assert.ok(h.expiresInMs > 0 && h.expiresInMs <= 5000);

    const mine = (await a.list()).find((s) => s.session === a.session);
    assert.equal(mine.client, 'inspector');
    assert.equal(mine.attached, true);
    assert.equal(mine.leases.length, 1);
    assert.equal(mine.leases[0].lease, lease.id);
    assert.equal(mine.leases[0].meta, 'nightly report');
    assert.equal(mine.leases[0].ttlMs, 5000);
    assert.ok(mine.leases[0].heldForMs >= 0);
    const all = await a.list({ all: true });
    assert.ok(all.some((s) => s.session === a.session));
    // A waiter shows as queued.
    const b = await client();
    const waiting = b.acquire(name, { waitMs: 10000 });
    await waitFor(async () => (await a.inspect(name)).queued === 1, { what: 'the waiter to queue' });
    await lease.release();
    await (await waiting).release();
  });

  test('check confirms a lease, and reports a broken one as not held', async () => {
    const a = await client();
    const lease = await a.tryAcquire(unique('chk'));
    const ok = await lease.check();
    assert.equal(ok.held, true);
    assert.equal(ok.token, lease.token);
    assert.ok(ok.expiresInMs > 0);
    await agent.ctl('break', lease.name);
    await lease.ended;
    assert.deepEqual(await lease.check(), { held: false, token: lease.token, expiresInMs: 0 });
  });

  test('a lease broken by `lockagent ctl break` is lost: polled, awaited and called back', async () => {
    const a = await client();
    const lease = await a.tryAcquire(unique('brk'), { scope: 'session' });
    const onLease = [];
    const onClient = [];
    lease.on('lost', (err) => onLease.push(err));
    a.on('lost', (l, err) => onClient.push([l, err]));
    assert.equal(lease.lost, false);
    lease.throwIfLost();

    const out = await agent.ctl('break', lease.name);
    assert.match(out, /1 lease\(s\) broken/);

    await waitFor(() => lease.lost, { what: 'the lease to be polled as lost' });
    const err = await lease.ended;
    assert.ok(err instanceof LeaseLostError);
    assert.ok(err instanceof LockAgentError);
    assert.equal(err.code, 'lease_lost');
    assert.equal(err.reason, 'broken');
    assert.equal(err.lease, lease);
    assert.equal(lease.lostReason, 'broken');
    assert.equal(lease.held, false);
    assert.throws(() => lease.throwIfLost(), err);
    assert.equal(lease.signal.aborted, true);
    assert.equal(lease.signal.reason, err);
    assert.deepEqual(onLease, [err]);
    assert.deepEqual(onClient, [[lease, err]]);
    assert.deepEqual(a.leases, []);
    assert.equal(await lease.release(), false, 'a lost lease has nothing to release');
  });

  test('a lease lost right after its grant is lost, even in the same read', async () => {
    const a = await client();
    const name = unique('fast');
    // Pipelined: the agent answers the acquire, then sends its lost event,
    // then answers the break, likely all in one read.
    const [lease, broken] = await Promise.all([a.tryAcquire(name), a.break(name)]);
    assert.equal(broken, 1);
    assert.equal(lease.lost, true);
    assert.equal(lease.lostReason, 'broken');
  });

  test('client.break ends every lease on a name', async () => {
    const [a, b] = [await client(), await client()];
    const name = unique('brk2');
    const l1 = await a.tryAcquire(name, { mode: 'shared' });
    const l2 = await b.tryAcquire(name, { mode: 'shared' });
    assert.equal(await b.break(name), 2);
    assert.equal((await l1.ended).reason, 'broken');
    assert.equal((await l2.ended).reason, 'broken');
    assert.equal(await a.break(name), 0);
  });

  test('an AbortSignal cancels a waiting acquire', async () => {
    const [a, b] = [await client(), await client()];
    const name = unique('cancel');
    const held = await a.tryAcquire(name);
    const ctl = new AbortController();
    const waiting = b.acquire(name, { signal: ctl.signal });
    await waitFor(async () => (await b.list()).find((s) => s.session === b.session).waiting.length === 1,
      { what: 'the acquire to wait' });
    ctl.abort();
    await assert.rejects(waiting, { name: 'AbortError' });
    const mine = (await b.list()).find((s) => s.session === b.session);
    assert.deepEqual(mine.waiting, []);

    await assert.rejects(b.acquire(name, { signal: AbortSignal.timeout(100) }), { name: 'TimeoutError' });
    await assert.rejects(b.acquire(name, { signal: AbortSignal.abort() }), { name: 'AbortError' });

    await held.release();
    const lease = await b.acquire(name, { signal: AbortSignal.timeout(5000) });
    assert.ok(lease, 'the name can be acquired again after a cancel');
  });

  test('agent errors are AgentErrors carrying the protocol code', async () => {
    const a = await client();
    const name = unique('err');
    const lease = await a.tryAcquire(name);

    const held = await a.tryAcquire(name).catch((e) => e);
    assert.ok(held instanceof AgentError);
    assert.ok(held instanceof LockAgentError);
    assert.ok(held instanceof Error);
    assert.equal(held.code, 'already_held');
    assert.equal(held.op, 'acquire');
    assert.equal(held.lease, lease, 'already_held carries the lease the session holds');

    await assert.rejects(a.tryAcquire('has space'), { name: 'AgentError', code: 'invalid_name' });
    await assert.rejects(a.tryAcquire(unique('e'), { limit: 2 }), { code: 'invalid_argument' });
    await assert.rejects(a.tryAcquire(unique('e'), { ttlMs: 10 }), { code: 'invalid_argument' });
    await assert.rejects(a.tryAcquire(unique('e'), { meta: 'x'.repeat(300) }), { code: 'invalid_argument' });
    await assert.rejects(a.request('release', { lease: 'l_nope' }), { code: 'not_held' });
    await assert.rejects(a.request('frobnicate'), { code: 'unknown_op' });
    await assert.rejects(a.request('hello'), { code: 'bad_request' });
    await assert.rejects(connect({ socket: agent.socket, heartbeatMs: 5 }), { code: 'invalid_argument' });

    // A request longer than the agent's line limit is refused before it is
    // sent, and the connection stays up.
    const tooLong = await a.tryAcquire(`x/${'y'.repeat(70000)}`).catch((e) => e);
    assert.ok(tooLong instanceof LockAgentError);
    assert.equal(tooLong.code, 'line_too_long');
    assert.equal(a.connected, true);
    assert.equal(lease.held, true);
    assert.ok((await a.ping()) >= 0);
  });

  test('close ends the session: leases released, later calls refused', async () => {
    const [a, b] = [await client(), await client()];
    const name = unique('close');
    const l1 = await a.tryAcquire(name);
    const l2 = await a.tryAcquire(unique('close'), { scope: 'session' });
    const closed = new Promise((r) => a.once('close', r));
    await a.close();
    await closed;
    assert.equal(a.closed, true);
    assert.equal(a.connected, false);
    assert.equal(l1.released, true);
    assert.equal(l2.released, true);
    assert.equal(l1.lost, false);
    const err = await a.tryAcquire(name).catch((e) => e);
    assert.ok(err instanceof ConnectionError);
    assert.equal(err.code, 'connection_closed');
    assert.ok(await b.tryAcquire(name), 'the lock is free after close');
    await a.close();
  });

  test('close right after a break ends the session: its leases are not left held', async () => {
    const b = await client();
    // Before the client saw the break, as it reconnects, and after.
    for (const settle of [-1, 0, 1, 5, 50]) {
      const a = await client({ sessionTtlMs: 30000 });
      const name = unique('close-break');
      const lease = await a.tryAcquire(name, { scope: 'session' });
      a._sock.destroy();
      if (settle >= 0) await new Promise((r) => setTimeout(r, settle));
      await a.close();
      assert.equal(lease.released, true);
      assert.ok(await b.tryAcquire(name), `free at once (settle ${settle} ms)`);
    }
  });

  test('a second close() resolves only once the first has ended the session', async () => {
    const b = await client();
    // Connected (the first says bye), and just after a break (it resumes the session to say bye).
    for (const broken of [false, true]) {
      const a = await client({ sessionTtlMs: 30000 });
      const name = unique('close-twice');
      const lease = await a.tryAcquire(name, { scope: 'session' });
      let closeEmitted = false;
      a.once('close', () => { closeEmitted = true; });
      if (broken) a._sock.destroy();
      const first = a.close();
      await a.close();
      assert.equal(closeEmitted, true, `the close is complete (broken: ${broken})`);
      assert.equal(a.connected, false);
      assert.equal(lease.released, true);
      assert.ok(await b.tryAcquire(name), `free at once (broken: ${broken})`);
      await first;
    }
  });

  test('Symbol.asyncDispose releases a lease and closes a client', async () => {
    assert.equal(typeof Symbol.asyncDispose, 'symbol', 'this Node has Symbol.asyncDispose');
    const a = await client();
    const lease = await a.tryAcquire(unique('dispose'));
    await lease[Symbol.asyncDispose]();
    assert.equal(lease.released, true);
    await a[Symbol.asyncDispose]();
    assert.equal(a.closed, true);
  });

  test('heartbeats are sent on their own: an idle client keeps its locks', async () => {
    const a = await client({ heartbeatMs: 400 });
    const lease = await a.tryAcquire(unique('hb'));
    // Five heartbeat periods of idleness: the agent would have dropped a
    // silent connection after one.
    await new Promise((r) => setTimeout(r, 2000));
    assert.equal(lease.held, true);
    assert.equal((await lease.check()).held, true);
  });

  test('a hung process loses its locks through the heartbeat', async () => {
    const a = await client({ heartbeatMs: 200, reconnect: false });
    const b = await client();
    const lease = await a.tryAcquire(unique('hang'));
    // Block the event loop, as a hung application would: no ping goes out.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1500);
    const err = await lease.ended;
    assert.equal(err.reason, 'disconnected');
    assert.equal(a.closed, true, 'without reconnect the client is closed');
    assert.ok(await b.tryAcquire(lease.name), 'the agent freed the lock');
  });

  test('reconnect resumes the session: connection leases lost, session leases kept', async () => {
    const a = await client({ sessionTtlMs: 10000 });
    const b = await client();
    const connLease = await a.tryAcquire(unique('conn'));
    const sessLease = await a.tryAcquire(unique('sess'), { scope: 'session' });
    const session = a.session;
    const events = [];
    a.on('disconnect', (err) => events.push(['disconnect', err.code]));
    const reconnected = new Promise((r) => a.once('reconnect', r));

    // Another connection takes the session over: the agent closes a's
    // connection, exactly as after any break.
    const raw = await RawConn.connect(agent.socket);
    const res = await raw.call({ id: 1, op: 'hello', resume: { session, token: a.resumeToken } });
    assert.equal(res.resumed, true);

    const lost = await connLease.ended;
    assert.equal(lost.reason, 'disconnected');
    assert.deepEqual(events[0], ['disconnect', 'connection_closed']);
    assert.deepEqual(await reconnected, { session, resumed: true });
    await waitFor(() => raw.ended, { what: 'the agent to close the other connection' });
    assert.equal(a.connected, true);
    assert.equal(a.session, session);
    assert.equal(sessLease.held, true);
    assert.equal((await sessLease.check()).held, true);
    assert.ok(await b.tryAcquire(connLease.name), 'the connection lease was freed');
    assert.equal(await b.tryAcquire(sessLease.name), null, 'the session lease is still held');
    assert.equal(await sessLease.release(), true);
  });

  test('a resume whose check the backend cannot answer keeps the lease, and reconnects once', { timeout: 20000 }, async () => {
    const a = await client({ sessionTtlMs: 10000 });
    const lease = await a.tryAcquire(unique('unsure'), { scope: 'session' });
    const call = a._call.bind(a);
    let refused = 0;
    a._call = (op, args, opts) => {
      if (op === 'check' && opts?.handshake) {
        refused++;
        return Promise.reject(new lockagent.AgentError('check', { code: 'backend_unavailable', message: 'down' }));
      }
      return call(op, args, opts);
    };
    let reconnects = 0;
    a.on('reconnect', () => reconnects++);
    const reconnected = new Promise((r) => a.once('reconnect', r));
    a._sock.destroy();
    await reconnected;
    await new Promise((r) => setTimeout(r, 300)); // room for a second reconnect, were there one
    assert.equal(refused, 1, 'one resume, its check refused');
    assert.equal(reconnects, 1);
    assert.equal(lease.held, true, 'the backend could not say: the lease stays');
    a._call = call;
    assert.equal((await lease.check()).held, true);
  });

  test('a grant that went down with the connection is given back on resume', { timeout: 20000 }, async () => {
    const a = await client({ sessionTtlMs: 10000 });
    const b = await client();
    const name = unique('stray');
    const onLine = a._onLine.bind(a);
    a._onLine = (line) => {
      if (line.includes('"acquired":true')) {
        a._onLine = onLine;
        a._sock.destroy();
        return;
      }
      onLine(line);
    };
    const reconnected = new Promise((r) => a.once('reconnect', r));
    await assert.rejects(a.tryAcquire(name, { scope: 'session' }), { name: 'ConnectionError' });
    assert.deepEqual(await reconnected, { session: a.session, resumed: true });
    await waitFor(async () => (await b.inspect(name)).locked === false, { what: 'the stray lease to be given back' });
    assert.equal(a.leases.length, 0);
  });

  test('a lost event that went down with the connection is made up for on resume', { timeout: 20000 }, async () => {
    const a = await client({ sessionTtlMs: 10000 });
    const lease = await a.tryAcquire(unique('dropped'), { scope: 'session' });
    // The lost event reaches a connection that breaks before the client
    // reads it: the agent delivered it, the client never saw it.
    const onLine = a._onLine.bind(a);
    a._onLine = (line) => {
      if (line.includes('"event":"lost"')) {
        a._onLine = onLine;
        a._sock.destroy();
        return;
      }
      onLine(line);
    };
    const reconnected = new Promise((r) => a.once('reconnect', r));
    assert.match(await ctlAt(agent.socket, 'break', lease.name), /1 lease\(s\) broken/);
    assert.deepEqual(await reconnected, { session: a.session, resumed: true });
    const err = await lease.ended;
    assert.equal(err.reason, 'expired', 'the resumed session no longer has it');
  });

  test('events missed while disconnected are delivered on resume', async () => {
    const a = await client({ sessionTtlMs: 10000 });
    const lease = await a.tryAcquire(unique('missed'), { scope: 'session' });
    const session = a.session;
    // Hide the socket so that the client cannot reconnect yet, and take
    // the session over through the hidden path.
    const hidden = path.join(agent.dir, 'hidden.sock');
    fs.renameSync(agent.socket, hidden);
    try {
      const disconnected = new Promise((r) => a.once('disconnect', r));
      const raw = await RawConn.connect(hidden);
      await raw.call({ id: 1, op: 'hello', resume: { session, token: a.resumeToken } });
      await disconnected;
      await assert.rejects(a.tryAcquire(unique('x')), { name: 'ConnectionError', code: 'not_connected' });
      raw.close(); // the session is now detached
      await waitFor(async () => {
        const sessions = JSON.parse(await ctlAt(hidden, 'list', '-json')).sessions;
        return sessions.some((s) => s.session === session && !s.attached);
      }, { what: 'the session to be detached' });
      assert.match(await ctlAt(hidden, 'break', lease.name), /1 lease\(s\) broken/);
      assert.equal(lease.held, true, 'the client cannot know yet');
    } finally {
      fs.renameSync(hidden, agent.socket);
    }
    const err = await lease.ended;
    assert.equal(err.reason, 'broken');
    assert.equal(a.session, session);
    await a.ready();
    assert.equal(a.connected, true);
  });

  test('a string that is not well-formed is refused before it is sent', { timeout: 10000 }, async () => {
    const a = await client();
    // Half of the rocket's surrogate pair: JSON.stringify writes it as
    // \ud83d, which the agent cannot decode (and answers with id null).
    const halfRocket = 'job for 🚀…'.slice(0, 9);
    await assert.rejects(a.tryAcquire(unique('lone'), { meta: halfRocket }),
      { name: 'LockAgentError', code: 'invalid_argument', message: /meta/ });
    await assert.rejects(a.tryAcquire('a\ud800b'), { name: 'LockAgentError', code: 'invalid_argument', message: /name/ });
    await assert.rejects(a.campaign(unique('lone'), { meta: '\udc00' }), { code: 'invalid_argument' });
    await assert.rejects(connect({ socket: agent.socket, client: '\udc00x' }), { code: 'invalid_argument' });
    const lease = await a.tryAcquire(unique('lone'), { meta: 'job for 🚀…' });
    assert.equal(lease.meta, 'job for 🚀…', 'a whole pair is fine');
    assert.equal(a.connected, true);
  });

  test('an answer with id null settles the request it answers, or closes the connection when unclear', { timeout: 10000 }, async () => {
    const a = await client();
    const b = await client();
    // A line the agent cannot decode, made on the wire out of a request of the client's.
    const undecodable = () => {
      const write = a._sock.write.bind(a._sock);
      a._sock.write = (data, ...rest) => write(data.replace('"UNDECODABLE"', '"\\ud800"'), ...rest);
    };
    undecodable();
    await assert.rejects(a.request('ping', { x: 'UNDECODABLE' }), { name: 'AgentError', code: 'bad_request', op: 'ping' });
    assert.equal(a.connected, true);
    assert.ok((await a.ping()) >= 0, 'later answers still go to their requests');
    // The error is not left behind as the cause of a later break.
    let disconnected = new Promise((r) => a.once('disconnect', r));
    a._sock.destroy();
    assert.equal((await disconnected).cause, undefined);
    await a.ready();

    // Behind a waiting acquire, which is answered out of order, whose
    // answer it is is unclear: the connection is closed with it as cause.
    undecodable();
    const name = unique('null-id');
    assert.ok(await b.tryAcquire(name));
    disconnected = new Promise((r) => a.once('disconnect', r));
    const results = await Promise.allSettled([a.acquire(name), a.request('ping', { x: 'UNDECODABLE' })]);
    for (const { status, reason } of results) {
      assert.equal(status, 'rejected');
      assert.equal(reason.name, 'ConnectionError');
      assert.equal(reason.cause?.code, 'bad_request');
    }
    assert.equal((await disconnected).cause?.code, 'bad_request');
  });

  test('a wait or a timeoutMs longer than a timer can be is not cut short', async () => {
    const month = 30 * 24 * 3600 * 1000;
    const [a, b] = [await client(), await client({ timeoutMs: month })];
    await b.ping();
    const name = unique('long');
    await a.tryAcquire(name);
    const stop = new AbortController();
    const waiting = b.acquire(name, { waitMs: month, signal: stop.signal });
    const early = await Promise.race([waiting.then(() => 'settled', () => 'settled'),
      new Promise((r) => setTimeout(() => r('waiting'), 300))]);
    assert.equal(early, 'waiting');
    stop.abort();
    await assert.rejects(waiting, { name: 'AbortError' });
  });

  test('fractional numbers are rounded up; NaN, infinities and negative numbers are refused', async () => {
    const a = await client({ sessionTtlMs: 1000.5, heartbeatMs: 5000.5 });
    const b = await client();
    const lease = await a.tryAcquire(unique('frac'), { ttlMs: 1500.5 });
    assert.equal(lease.ttlMs, 1501);
    const held = unique('frac');
    assert.ok(await b.tryAcquire(held));
    assert.equal(await a.acquire(held, { waitMs: 250.5 }), null, 'waited, then timed out');
    assert.ok(await a.tryAcquire(unique('frac'), { mode: 'shared', limit: 2.5 }));
    const campaign = await a.campaign(unique('frac'), { ttlMs: 1500.5 });
    assert.equal((await campaign.elected({ signal: AbortSignal.timeout(5000) })).ttlMs, 1501);

    const refused = { name: 'LockAgentError', code: 'invalid_argument' };
    for (const bad of [NaN, Infinity, -Infinity, -1, -0.5]) {
      await assert.rejects(a.tryAcquire(unique('frac'), { ttlMs: bad }), refused, `ttlMs ${bad}`);
      await assert.rejects(a.tryAcquire(unique('frac'), { mode: 'shared', limit: bad }), refused, `limit ${bad}`);
      await assert.rejects(a.campaign(unique('frac'), { ttlMs: bad }), refused, `campaign ttlMs ${bad}`);
      await assert.rejects(connect({ socket: agent.socket, sessionTtlMs: bad }), refused, `sessionTtlMs ${bad}`);
      await assert.rejects(connect({ socket: agent.socket, heartbeatMs: bad }), refused, `heartbeatMs ${bad}`);
      if (bad !== Infinity && bad !== -1) await assert.rejects(a.acquire(unique('frac'), { waitMs: bad }), refused, `waitMs ${bad}`);
    }
    assert.equal(a.leases.length, 3, 'nothing refused was acquired');
    const forever = a.acquire(held, { waitMs: -1 }); // the protocol's -1: as long as it takes
    await b.leases[0].release();
    assert.ok(await forever, 'waitMs -1 waited until granted');
  });

  test('a release whose answer went down with the connection ends the lease as released on resume', { timeout: 20000 }, async () => {
    const a = await client({ sessionTtlMs: 10000 });
    const b = await client();
    const lease = await a.tryAcquire(unique('release-lost'), { scope: 'session' });
    const lost = [];
    a.on('lost', (l, err) => lost.push(err));
    const onLine = a._onLine.bind(a);
    a._onLine = (line) => {
      if (line.includes('"released":true')) {
        a._onLine = onLine;
        a._sock.destroy();
        return;
      }
      onLine(line);
    };
    const reconnected = new Promise((r) => a.once('reconnect', r));
    await assert.rejects(lease.release(), { name: 'ConnectionError' });
    assert.deepEqual(await reconnected, { session: a.session, resumed: true });
    assert.equal(await lease.ended, null, 'released, not lost');
    assert.equal(lease.released, true);
    assert.equal(lease.lost, false);
    assert.deepEqual(lost, []);
    assert.ok(await b.tryAcquire(lease.name));
  });

  /** `lockagent ctl` against another socket path of the shared agent. */
  function ctlAt(socket, ...args) {
    return new Promise((resolve, reject) => {
      execFile(agent.bin, ['ctl', args[0], '-socket', socket, ...args.slice(1)], { env: cleanEnv() }, (err, stdout) => {
        if (err) reject(err); else resolve(stdout);
      });
    });
  }
});

describe('agent restarts', () => {
  test('a SIGTERM sends shutdown: every lease is lost, and the client reconnects to the new agent', async () => {
    let agent = await Agent.start();
    const a = await connect({ socket: agent.socket, sessionTtlMs: 10000 });
    try {
      const l1 = await a.tryAcquire('restart/1');
      const l2 = await a.tryAcquire('restart/2', { scope: 'session' });
      const shutdown = new Promise((r) => a.once('shutdown', r));
      const reconnected = new Promise((r) => a.once('reconnect', r));
      await agent.kill('SIGTERM');
      assert.match(await shutdown, /stopping/);
      assert.equal((await l1.ended).reason, 'shutdown');
      assert.equal((await l2.ended).reason, 'shutdown');
      const oldSession = a.session;
      agent = await Agent.start({ dir: agent.dir });
      const info = await reconnected;
      assert.equal(info.resumed, false, 'the new agent does not know the session');
      assert.notEqual(info.session, oldSession);
      const l3 = await a.tryAcquire('restart/1');
      assert.ok(l3.token > l1.token, 'tokens keep increasing across restarts');
    } finally {
      await a.close();
      await agent.stop();
    }
  });

  test('a session the agent forgot is lost as session_expired on resume', async () => {
    let agent = await Agent.start();
    const a = await connect({ socket: agent.socket, sessionTtlMs: 10000 });
    try {
      const sess = await a.tryAcquire('gone/1', { scope: 'session' });
      const disconnected = new Promise((r) => a.once('disconnect', r));
      await agent.kill('SIGKILL');
      await disconnected;
      assert.equal(sess.held, true, 'a session lease outlives the connection');
      const reconnected = new Promise((r) => a.once('reconnect', r));
      agent = await Agent.start({ dir: agent.dir });
      assert.equal((await sess.ended).reason, 'session_expired');
      assert.equal((await reconnected).resumed, false);
    } finally {
      await a.close();
      await agent.stop();
    }
  });

  test('release and resign of session-scoped objects give up on an agent that does not come back', { timeout: 30000 }, async () => {
    const agent = await Agent.start();
    const a = await connect({ socket: agent.socket, sessionTtlMs: 10000 });
    try {
      const campaign = await a.campaign('gone/leader', { scope: 'session' });
      const term = await campaign.elected({ signal: AbortSignal.timeout(5000) });
      const lease = await a.tryAcquire('gone/2', { scope: 'session' });
      const lost = [];
      a.on('lost', (l, err) => lost.push(err));
      const disconnected = new Promise((r) => a.once('disconnect', r));
      await agent.kill('SIGKILL');
      await disconnected;
      const start = Date.now();
      const [released] = await Promise.all([lease.release(), campaign.resign()]);
      assert.ok(Date.now() - start < 8000, 'within END_WAIT_MS');
      assert.equal(released, false, 'the release was not confirmed');
      assert.equal(lease.released, true);
      assert.equal(term.released, true);
      assert.equal(campaign.ended, true);
      assert.deepEqual(lost, []);
    } finally {
      await a.close();
      await agent.stop();
    }
  });

  test('a stopped agent: calls and close() give up after timeoutMs; a grant that comes later is given back', { timeout: 20000 }, async () => {
    const agent = await Agent.start();
    const a = await connect({ socket: agent.socket, timeoutMs: 300 });
    const b = await connect({ socket: agent.socket });
    try {
      await agent.pause();
      let start = Date.now();
      await assert.rejects(a.tryAcquire('stopped/1'), (err) => err instanceof lockagent.AgentTimeoutError &&
        err instanceof LockAgentError && err.code === 'agent_timeout' && err.op === 'acquire');
      assert.ok(Date.now() - start < 5000, 'the try gave up after timeoutMs');
      await assert.rejects(a.acquire('stopped/2', { waitMs: 200 }), { code: 'agent_timeout' });
      assert.ok(Date.now() - start < 5000, 'the wait gave up after waitMs and timeoutMs');
      agent.resume();
      // The agent reads the try at last and grants it: the client gives it back.
      await waitFor(async () => (await b.tryAcquire('stopped/1')) !== null, { timeoutMs: 10000, what: 'the late grant to be given back' });
      await agent.pause();
      start = Date.now();
      await a.close();
      assert.ok(Date.now() - start < 5000, 'close() gave up on the bye after timeoutMs');
    } finally {
      agent.resume();
      await a.close();
      await b.close();
      await agent.stop();
    }
  });

  test('permission_denied when the agent has no admins', async () => {
    const agent = await Agent.start({ config: 'acl {\n  admin_uids = []\n}' });
    const a = await connect({ socket: agent.socket });
    try {
      await assert.rejects(a.break('x/1'), { name: 'AgentError', code: 'permission_denied', op: 'break' });
      await assert.rejects(a.list({ all: true }), { code: 'permission_denied' });
    } finally {
      await a.close();
      await agent.stop();
    }
  });
});
