'use strict';
// Test support: the real lockagent binary, built once per test process (or
// taken from LOCKAGENT_BIN), and real agent processes, each with its own
// socket and state directory in a temporary directory. Nothing is mocked.
// The repository is the one the tests are in, or LOCKAGENT_REPO: the tests
// of an installed client run from a copy, away from the checkout.

const { execFile, spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { promisify } = require('node:util');

const execFileP = promisify(execFile);
const repoRoot = process.env.LOCKAGENT_REPO || path.resolve(__dirname, '..', '..', '..');

let built;
// HOME and XDG_RUNTIME_DIR of the processes the tests start (see cleanEnv).
let home;

/**
 * The test's environment for the processes it starts, with extra set, and
 * without what would lead them to another agent (LOCKAGENT_SOCKET, which
 * overrides an agent's config, as the README has its reader export it),
 * to the host's systemd or to the user's directories: HOME and
 * XDG_RUNTIME_DIR are a directory of the test process's, so that a
 * default socket or state directory a process derives lies there. The
 * tests never depend on the shell they run in.
 */
function cleanEnv(extra = {}) {
  if (home === undefined) {
    home = fs.mkdtempSync(path.join(os.tmpdir(), 'la-node-home-'));
    process.on('exit', () => fs.rmSync(home, { recursive: true, force: true }));
  }
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('LOCKAGENT_')) continue;
    if (['HOME', 'XDG_RUNTIME_DIR', 'XDG_STATE_HOME', 'NOTIFY_SOCKET', 'INVOCATION_ID', 'LISTEN_FDS', 'LISTEN_PID',
      'LISTEN_FDNAMES', 'WATCHDOG_USEC', 'WATCHDOG_PID', 'JOURNAL_STREAM', 'CREDENTIALS_DIRECTORY'].includes(k)) continue;
    env[k] = v;
  }
  return { ...env, HOME: home, XDG_RUNTIME_DIR: home, ...extra };
}

/**
 * The lockagent binary: LOCKAGENT_BIN, else built from ./cmd/lockagent once,
 * with the race detector (an agent that reports a race fails: see stop).
 */
function lockagentBin() {
  if (process.env.LOCKAGENT_BIN) return Promise.resolve(process.env.LOCKAGENT_BIN);
  built ??= (async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'la-node-bin-'));
    process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
    const bin = path.join(dir, 'lockagent');
    await execFileP('go', ['build', '-race', '-o', bin, './cmd/lockagent'], { cwd: repoRoot });
    return bin;
  })();
  return built;
}

/**
 * Polls cond (sync or async) every 5 ms until it returns a truthy value,
 * which it resolves with; fails after timeoutMs.
 */
async function waitFor(cond, { timeoutMs = 5000, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Whether something accepts connections on the socket path. */
function canConnect(socket) {
  return new Promise((resolve) => {
    const s = net.createConnection(socket);
    s.once('connect', () => { s.destroy(); resolve(true); });
    s.once('error', () => resolve(false));
  });
}

/**
 * A running agent. `config` is extra HCL appended to the socket and
 * state_dir settings. `dir` may be reused to restart an agent on the same
 * socket and state directory.
 */
class Agent {
  static async start({ config = '', dir } = {}) {
    const bin = await lockagentBin();
    dir ??= fs.mkdtempSync(path.join(os.tmpdir(), 'la-node-'));
    const socket = path.join(dir, 'agent.sock');
    const configFile = path.join(dir, 'lockagent.hcl');
    fs.writeFileSync(configFile,
      `socket { path = ${JSON.stringify(socket)} }\nstate_dir = ${JSON.stringify(path.join(dir, 'state'))}\n${config}\n`);
    // A race-detecting agent exits without the detector's second of sleep.
    const proc = spawn(bin, ['agent', '-config', configFile, '-log-level', 'warn'], {
      stdio: ['ignore', 'ignore', 'pipe'],
      env: cleanEnv({ GORACE: 'atexit_sleep_ms=0' }),
    });
    const agent = new Agent(bin, dir, socket, proc);
    await waitFor(async () => {
      if (agent.exited) throw new Error(`the agent exited: ${agent.stderr}`);
      return canConnect(socket);
    }, { timeoutMs: 10000, what: 'the agent to listen' });
    return agent;
  }

  constructor(bin, dir, socket, proc) {
    this.bin = bin;
    this.dir = dir;
    this.socket = socket;
    this.proc = proc;
    this.stderr = '';
    this.exited = false;
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => { this.stderr += d; });
    this.exit = new Promise((resolve) => proc.on('exit', (code, signal) => {
      this.exited = true;
      resolve({ code, signal });
    }));
  }

  /** Runs `lockagent ctl ARGS...` against this agent; resolves with stdout. */
  async ctl(...args) {
    const { stdout } = await execFileP(this.bin, ['ctl', args[0], '-socket', this.socket, ...args.slice(1)], { env: cleanEnv() });
    return stdout;
  }

  /** Sends sig and waits for the agent to exit. */
  async kill(sig = 'SIGTERM') {
    if (!this.exited) this.proc.kill(sig);
    return this.exit;
  }

  /**
   * Stops the agent's process (SIGSTOP) and waits until every thread of it
   * is stopped: the signal reaches the threads one after the other, and a
   * thread not stopped yet could still answer.
   */
  async pause() {
    this.proc.kill('SIGSTOP');
    const pid = this.proc.pid;
    const stopped = (task) => {
      const stat = fs.readFileSync(`/proc/${pid}/task/${task}/stat`, 'utf8');
      return stat[stat.lastIndexOf(')') + 2] === 'T';
    };
    await waitFor(() => fs.readdirSync(`/proc/${pid}/task`).every(stopped), { what: 'the agent to stop' });
  }

  /** Lets a paused agent go on (SIGCONT). */
  resume() {
    this.proc.kill('SIGCONT');
  }

  /** Stops the agent and removes its directory; throws if it reported a data race. */
  async stop() {
    await this.kill('SIGTERM');
    fs.rmSync(this.dir, { recursive: true, force: true });
    if (this.stderr.includes('WARNING: DATA RACE')) throw new Error(`the agent reported a data race:\n${this.stderr}`);
  }
}

/**
 * A raw protocol connection, for what the client under test must not do
 * itself (taking its session over, for instance).
 */
class RawConn {
  static connect(socket) {
    return new Promise((resolve, reject) => {
      const s = net.createConnection(socket);
      s.once('error', reject);
      s.once('connect', () => resolve(new RawConn(s)));
    });
  }

  constructor(sock) {
    this.sock = sock;
    this.lines = [];
    this.ended = false;
    let buf = '';
    sock.setEncoding('utf8');
    sock.on('data', (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        this.lines.push(JSON.parse(buf.slice(0, i)));
        buf = buf.slice(i + 1);
      }
    });
    sock.on('error', () => {});
    sock.on('close', () => { this.ended = true; });
  }

  /** Sends a request and waits for the answer with its id. */
  async call(req) {
    this.sock.write(`${JSON.stringify(req)}\n`);
    return waitFor(() => this.lines.find((l) => l.id === req.id), { what: `answer to ${req.op}` });
  }

  close() { this.sock.destroy(); }
}

module.exports = { Agent, RawConn, cleanEnv, lockagentBin, waitFor, repoRoot };
