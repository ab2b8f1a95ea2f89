'use strict';
// The harness itself: what the user has set up (an agent running,
// LOCKAGENT_SOCKET exported as the README says, XDG_RUNTIME_DIR, systemd's
// variables) never reaches the processes the tests start. This file sets
// them in its own process, which runs no other test file.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { after, before, test } = require('node:test');

const { Agent, cleanEnv, lockagentBin } = require('./harness.js');

let users;
let usersAgent;
let reached = 0;
const saved = { ...process.env };

before(async () => {
  users = fs.mkdtempSync(path.join(os.tmpdir(), 'la-users-'));
  // The user's agent: a socket that accepts connections, which an agent
  // takes for a live agent's, both where LOCKAGENT_SOCKET and where
  // XDG_RUNTIME_DIR lead.
  const sock = path.join(users, 'lockagent.sock');
  usersAgent = net.createServer((c) => { reached++; c.destroy(); });
  await new Promise((resolve) => usersAgent.listen(sock, resolve));
  Object.assign(process.env, {
    LOCKAGENT_SOCKET: sock,
    XDG_RUNTIME_DIR: users,
    HOME: users,
    XDG_STATE_HOME: users,
    NOTIFY_SOCKET: path.join(users, 'notify'),
    INVOCATION_ID: '1f2e',
    CREDENTIALS_DIRECTORY: users,
  });
});

after(async () => {
  for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
  Object.assign(process.env, saved);
  await new Promise((resolve) => usersAgent.close(resolve));
  fs.rmSync(users, { recursive: true, force: true });
});

test('an agent starts on the socket of its config, not on the user\'s agent\'s', async () => {
  const agent = await Agent.start();
  try {
    assert.match(await agent.ctl('status'), /memory/);
  } finally {
    await agent.stop();
  }
  assert.equal(reached, 0, 'connections to the user\'s agent');
});

test('a client command given no socket does not find the user\'s agent', async () => {
  const bin = await lockagentBin();
  const err = await new Promise((resolve) => {
    execFile(bin, ['ctl', 'status'], { env: cleanEnv() }, (e, stdout, stderr) => resolve(e && stderr));
  });
  assert.match(err, /cannot reach the agent/);
  assert.ok(!err.includes(users), err);
  assert.equal(reached, 0, 'connections to the user\'s agent');
});

test('cleanEnv keeps none of the user\'s settings, and adds what it is given', () => {
  const env = cleanEnv({ LOCKAGENT_SOCKET: '/tmp/la-test.sock' });
  assert.equal(env.LOCKAGENT_SOCKET, '/tmp/la-test.sock');
  for (const k of ['NOTIFY_SOCKET', 'INVOCATION_ID', 'XDG_STATE_HOME', 'CREDENTIALS_DIRECTORY']) {
    assert.equal(env[k], undefined, k);
  }
  assert.equal(env.XDG_RUNTIME_DIR, env.HOME);
  assert.ok(!env.HOME.startsWith(users), env.HOME);
  assert.equal(cleanEnv().LOCKAGENT_SOCKET, undefined);
});
