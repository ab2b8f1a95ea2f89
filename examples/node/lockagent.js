'use strict';
/**
 * lockagent client for Node.js 18 and later, with no dependencies.
 *
 * Install the `lockagent` package, or vendor this one file into an
 * application (its types are in lockagent.d.ts). It speaks the lockagent
 * wire protocol (newline-delimited JSON over the agent's Unix socket) and
 * gives locks as `Lease` objects:
 *
 *     const { connect } = require('lockagent');
 *     const client = await connect({ client: 'billing-worker' });
 *     const lease = await client.acquire('orders/42', { waitMs: 5000 });
 *     if (lease) {
 *       try {
 *         await writeInvoice({ fencingToken: lease.token, signal: lease.signal });
 *       } finally {
 *         await lease.release();
 *       }
 *     }
 *     await client.close();
 *
 * The contract: a lease is valid only while `lease.held` is true. It is
 * lost when the agent says so (broken by an admin, expired, taken over,
 * renewals failing) and, for every lease of scope `connection`, the moment
 * the connection to the agent breaks. Stop using the resource as soon as a
 * lease is lost: `lease.signal` aborts, `lease.ended` resolves, and `lost`
 * is emitted on the lease and on the client.
 *
 * @module lockagent
 */

const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const { EventEmitter } = require('node:events');

const PROTOCOL_VERSION = 1;

/** How long close() gives a reconnect under way, and ending a session whose connection broke. */
const END_WAIT_MS = 5000;

/** How long the client waits for an answer by default (`timeoutMs`), beyond an acquire's own wait. */
const DEFAULT_TIMEOUT_MS = 10000;

// How many sessions a list asks for at a time: each page is a small answer.
const LIST_PAGE = 100;

/** The longest timer Node keeps (about 24.8 days); a longer wait for an answer has no limit. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * A lone surrogate as JSON.stringify escapes it (`\ud83d`), not preceded
 * by an escaped backslash. The agent refuses a line with one (`bad_request`,
 * answered with `"id": null`), so the client refuses it first.
 */
const LONE_SURROGATE = /(?<!\\)(?:\\\\)*\\ud[89a-f][0-9a-f]{2}/;

/** Errors the agent answers with `"id": null` about the connection itself, which it then closes. */
const CONNECTION_ERRORS = new Set(['line_too_long', 'limit_exceeded']);

/** `Symbol.asyncDispose` where the runtime has it (Node 18.18+, 20.4+). */
const asyncDispose = typeof Symbol.asyncDispose === 'symbol' ? Symbol.asyncDispose : undefined;

/**
 * The socket path the agent listens on by default, computed as the agent
 * does: `/run/lockagent/agent.sock` for root and systemd services, else
 * `$XDG_RUNTIME_DIR/lockagent.sock`, else `$TMPDIR/lockagent-UID/agent.sock`.
 *
 * @param {NodeJS.ProcessEnv} [env] the environment to read
 * @param {number} [euid] the effective uid
 * @returns {string}
 */
function defaultSocketPath(env = process.env, euid = process.geteuid()) {
  if (euid === 0 || env.INVOCATION_ID || env.NOTIFY_SOCKET) {
    return '/run/lockagent/agent.sock';
  }
  const runtimeDir = env.XDG_RUNTIME_DIR;
  if (runtimeDir && path.isAbsolute(runtimeDir)) {
    return path.join(runtimeDir, 'lockagent.sock');
  }
  return path.join(privateDir(env, euid), 'agent.sock');
}

/** The default socket's directory for a user without a runtime directory. */
function privateDir(env = process.env, euid = process.geteuid()) {
  return path.join(env.TMPDIR || '/tmp', `lockagent-${euid}`);
}

/**
 * Refuses a socket in {@link privateDir} unless that directory is the
 * user's own and private: anybody could have made it in the temporary
 * directory and serve an agent of theirs there.
 *
 * @param {string} socket
 */
function checkPrivate(socket) {
  const dir = path.dirname(path.normalize(socket));
  if (dir !== privateDir()) return;
  const st = fs.lstatSync(dir);
  if (!st.isDirectory() || st.uid !== process.geteuid() || (st.mode & 0o077) !== 0) {
    throw new Error(`${dir} is not a directory private to uid ${process.geteuid()}`);
  }
}

/**
 * Where a client finds the agent: the explicit path if given, then the
 * `LOCKAGENT_SOCKET` environment variable, then {@link defaultSocketPath}.
 *
 * @param {string} [explicit]
 * @param {NodeJS.ProcessEnv} [env]
 * @returns {string}
 */
function socketPath(explicit, env = process.env) {
  return explicit || env.LOCKAGENT_SOCKET || defaultSocketPath(env);
}

// ---------------------------------------------------------------- errors

/**
 * The base class of every error this module throws. `code` is a stable
 * string: one of the protocol's error codes for an {@link AgentError}, or
 * one of this client's own (`connection_closed`, `not_connected`,
 * `connect_failed`, `agent_timeout`, `line_too_long`, `invalid_argument`,
 * `lease_lost`, `lease_released`, `campaign_ended`). `invalid_argument` is also the client's own code for an
 * argument it refuses before sending it: a string that is not well-formed
 * (a lone surrogate), a number option that is not finite or is negative.
 */
class LockAgentError extends Error {
  /**
   * @param {string} message
   * @param {string} code
   * @param {ErrorOptions} [options]
   */
  constructor(message, code, options) {
    super(message, options);
    this.name = 'LockAgentError';
    this.code = code;
  }
}

/**
 * An error answered by the agent. `code` is the protocol's error code
 * (`not_held`, `already_held`, `invalid_name`, `session_expired`, ...),
 * `op` the request's op. For `already_held`, `lease` is the lease the
 * session already holds on the name.
 */
class AgentError extends LockAgentError {
  constructor(op, error, lease) {
    super(`${op}: ${error.code}: ${error.message}`, error.code);
    this.name = 'AgentError';
    this.op = op;
    this.agentMessage = error.message;
    if (lease !== undefined) this.lease = lease;
  }
}

/**
 * The connection to the agent ended, or there was none, before an answer:
 * `code` is `connection_closed` (it broke, or the client was closed),
 * `not_connected` (the client is reconnecting) or `connect_failed` (no
 * agent listens at the socket path, or it may not be used). The cause, if
 * known, is in `cause` (for `connect_failed`, the system's error, e.g.
 * `cause.code === 'ENOENT'`).
 */
class ConnectionError extends LockAgentError {
  constructor(message, code, options) {
    super(message, code, options);
    this.name = 'ConnectionError';
  }
}

/**
 * The agent did not answer within the client's `timeoutMs` (beyond an
 * acquire's own wait): it is stopped or hung. `code` is `agent_timeout`. A
 * grant that comes later is released, a campaign resigned.
 */
class AgentTimeoutError extends LockAgentError {
  constructor(op, ms) {
    super(`${op}: the agent did not answer within ${ms} ms`, 'agent_timeout');
    this.name = 'AgentTimeoutError';
    this.op = op;
  }
}

/**
 * A lease was lost. `reason` is the agent's (`expired`, `broken`,
 * `taken_over`, `backend_unavailable`) or the client's own: `disconnected`
 * (the connection broke, which loses every connection-scoped lease, and
 * session-scoped ones too without a session TTL), `session_expired` (the
 * session could not be resumed), `shutdown` (the agent is stopping).
 */
class LeaseLostError extends LockAgentError {
  constructor(lease, reason) {
    super(`lease ${lease.id} on ${lease.name} (token ${lease.token}) lost: ${reason}`, 'lease_lost');
    this.name = 'LeaseLostError';
    this.reason = reason;
    this.lease = lease;
  }
}

// ----------------------------------------------------------------- lease

/**
 * A granted lock. Its fields are those of the protocol's lease: `id`,
 * `name`, `mode`, `scope`, `token` (the fencing token), `ttlMs`, plus the
 * `meta` it was acquired with.
 *
 * Loss, three ways: poll `held`/`lost`/`lostReason` (or call
 * `throwIfLost()`), await `ended`, or listen for `'lost'`. `signal` is an
 * AbortSignal that aborts when the lease stops being held, lost or
 * released: hand it to the work done under the lock.
 *
 * Events: `'lost'` (err: LeaseLostError).
 */
class Lease extends EventEmitter {
  /** @internal */
  constructor(client, fields, meta) {
    super();
    /** @type {string} the lease id */
    this.id = fields.lease;
    /** @type {string} */
    this.name = fields.name;
    /** @type {'exclusive'|'shared'} */
    this.mode = fields.mode;
    /** @type {'connection'|'session'} */
    this.scope = fields.scope;
    /** @type {number} the fencing token */
    this.token = fields.token;
    /** @type {number} */
    this.ttlMs = fields.ttl_ms;
    /** @type {string} */
    this.meta = meta ?? '';
    /** @type {string|null} why the lease was lost, null while it was not */
    this.lostReason = null;
    /** @type {boolean} true once released (by `release()` or `client.close()`) */
    this.released = false;
    this._client = client;
    this._abort = new AbortController();
    this._lostError = null;
    this._releasing = null;
    this._releaseSent = false;
    /**
     * Resolves once the lease is no longer held: with its LeaseLostError if
     * it was lost, with null if it was released. It never rejects.
     * @type {Promise<LeaseLostError|null>}
     */
    this.ended = new Promise((resolve) => { this._resolveEnded = resolve; });
  }

  /** True while the lease is neither lost nor released. */
  get held() { return this.lostReason === null && !this.released; }

  /** True once the lease is lost. */
  get lost() { return this.lostReason !== null; }

  /** Aborts when the lease stops being held; its reason says why. */
  get signal() { return this._abort.signal; }

  /** Throws the LeaseLostError if the lease is lost. */
  throwIfLost() {
    if (this._lostError) throw this._lostError;
  }

  /**
   * Releases the lease. Resolves true if this call released it, false if
   * it had already ended (released, or lost). A session-scoped lease
   * released while the client reconnects is released once it is back;
   * should it not be back within END_WAIT_MS (5 s), the lease ends as
   * released and this resolves false (the agent ends it with the session,
   * or gives it back when the session is resumed). If the connection
   * breaks before the answer, this rejects with a ConnectionError; a
   * session-scoped lease the resumed session no longer has then ends as
   * released, not lost.
   * @returns {Promise<boolean>}
   */
  release() {
    if (!this.held) return Promise.resolve(false);
    if (!this._releasing) {
      this._releasing = this._release().finally(() => { this._releasing = null; });
    }
    return this._releasing;
  }

  async _release() {
    try {
      if (this.scope === 'session' && !this._client.connected && !(await this._client._readyWithin(END_WAIT_MS))) {
        this._end(null);
        return false;
      }
      if (!this.held) return false;
      // Until answered: a release the connection takes down may have been
      // done, which the resume's check must not take for a loss.
      this._releaseSent = true;
      await this._client._call('release', { lease: this.id });
      this._end(null);
      return true;
    } catch (err) {
      // A release whose answer did not come may have been done.
      if (err.code !== 'connection_closed' && err.code !== 'agent_timeout') this._releaseSent = false;
      if (!this.held) return false;
      if (err.code === 'not_held') {
        this._end(null);
        return false;
      }
      throw err;
    }
  }

  /**
   * Asks the agent to confirm with its backend that the lease is still
   * held. A lease found gone is lost (reason `expired`) before this
   * resolves.
   * @returns {Promise<{held: boolean, token: number, expiresInMs: number}>}
   */
  async check() {
    if (!this.held) return { held: false, token: this.token, expiresInMs: 0 };
    let res;
    try {
      res = await this._client._call('check', { lease: this.id });
    } catch (err) {
      if (err.code !== 'not_held') throw err;
      this._end(new LeaseLostError(this, 'expired'));
      return { held: false, token: this.token, expiresInMs: 0 };
    }
    if (!res.held) this._end(new LeaseLostError(this, 'expired'));
    return { held: res.held, token: res.token, expiresInMs: res.expires_in_ms };
  }

  /** Ends the lease once: lost with `lostError`, or released when null. */
  _end(lostError) {
    if (!this.held) return;
    this._client._leases.delete(this.id);
    if (lostError) {
      this.lostReason = lostError.reason;
      this._lostError = lostError;
      this._abort.abort(lostError);
      this._resolveEnded(lostError);
      this.emit('lost', lostError);
      this._client.emit('lost', this, lostError);
    } else {
      this.released = true;
      this._abort.abort(new LockAgentError(`lease ${this.id} on ${this.name} released`, 'lease_released'));
      this._resolveEnded(null);
    }
  }
}
if (asyncDispose) {
  /** `await using lease = ...` releases the lease at the end of the block. */
  Lease.prototype[asyncDispose] = async function dispose() { await this.release(); };
}

// -------------------------------------------------------------- campaign

/**
 * A standing bid for leadership of a name, started with
 * `client.campaign()`. Each time it wins, the agent grants it a term: an
 * exclusive Lease on the name, with its fencing token. When the term ends
 * (lost, broken, released) the campaign contends again on its own, until
 * `resign()`.
 *
 * After a broken connection the client campaigns again once it is back,
 * unless the campaign is session-scoped and the session was resumed (the
 * agent kept it then).
 *
 * Events: `'elected'` (term: Lease), `'end'` (err: LockAgentError|null):
 * the campaign ended, resigned (null) or refused after a reconnect.
 */
class Campaign extends EventEmitter {
  /** @internal */
  constructor(client, name, options) {
    super();
    /** @type {string} the campaign id; a new one after a reconnect */
    this.id = null;
    /** @type {string} */
    this.name = name;
    /** @type {boolean} true once the campaign has ended */
    this.ended = false;
    this._client = client;
    this._options = options;
    this._waiters = [];
    this._endError = null;
    this._term = null;
  }

  /** @type {Lease|null} the current term, null while not leader */
  get leader() { return this._term?.held ? this._term : null; }

  /** The term's scope: `connection` (default) or `session`. */
  get scope() { return this._options.scope ?? 'connection'; }

  /**
   * Resolves with the current term if this campaign leads, else with the
   * next one it wins. Rejects with `signal.reason` on abort, and with a
   * LockAgentError (`campaign_ended`) if the campaign ends first.
   * @param {{signal?: AbortSignal}} [options]
   * @returns {Promise<Lease>}
   */
  elected({ signal } = {}) {
    if (this.leader) return Promise.resolve(this.leader);
    if (this.ended) return Promise.reject(this._endError);
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise((resolve, reject) => {
      const waiter = {};
      const onAbort = () => {
        this._waiters = this._waiters.filter((w) => w !== waiter);
        reject(signal.reason);
      };
      waiter.resolve = (term) => { signal?.removeEventListener('abort', onAbort); resolve(term); };
      waiter.reject = (err) => { signal?.removeEventListener('abort', onAbort); reject(err); };
      signal?.addEventListener('abort', onAbort, { once: true });
      this._waiters.push(waiter);
    });
  }

  /**
   * Stops contending and releases the current term, if any. Safe to call
   * more than once. A session-scoped campaign resigned while the client
   * reconnects is resigned once it is back; should it not be back within
   * END_WAIT_MS (5 s), this resolves and the term ends as released (the
   * agent ends it with the session, or the resume resigns it).
   */
  async resign() {
    if (this.ended) return;
    const client = this._client;
    const id = this.id;
    this._end(null);
    if (this.scope === 'session' && !client.connected) await client._readyWithin(END_WAIT_MS);
    const term = this.leader;
    if (!client.connected) {
      term?._end(null);
      return;
    }
    try {
      await client._call('resign', { campaign: id });
    } catch (err) {
      // not_held: the agent had already ended it (with the connection).
      if (err.code !== 'not_held' && client.connected) throw err;
    }
    term?._end(null);
  }

  /** Sends the campaign request; the agent answers with its id at once. */
  async _start() {
    const { ttlMs, meta } = this._options;
    const args = { name: this.name, scope: this._options.scope, ttl_ms: ttlMs, meta };
    // Registered as the answer is read: the next line may be its first
    // elected event.
    await this._client._call('campaign', args, {
      onAnswer: (res) => {
        if (this.ended) {
          // Resigned while this campaign was being started again: the
          // resign named the old id, so this one is resigned now.
          this._client._call('resign', { campaign: res.campaign }).catch(() => {});
          return;
        }
        this.id = res.campaign;
        this._client._campaigns.set(this.id, this);
      },
    });
  }

  _elected(ev) {
    const client = this._client;
    const term = new Lease(client, {
      lease: ev.lease,
      name: ev.name,
      mode: 'exclusive',
      scope: this.scope,
      token: ev.token,
      ttl_ms: this._options.ttlMs ?? client.agent.ttlMs.default,
    }, this._options.meta);
    client._leases.set(term.id, term);
    this._term = term;
    for (const w of this._waiters.splice(0)) w.resolve(term);
    this.emit('elected', term);
  }

  _end(err) {
    if (this.ended) return;
    this.ended = true;
    this._endError = err ?? new LockAgentError(`the campaign for ${this.name} has ended`, 'campaign_ended');
    this._client._campaigns.delete(this.id);
    for (const w of this._waiters.splice(0)) w.reject(this._endError);
    this.emit('end', err);
  }
}
if (asyncDispose) {
  /** `await using campaign = ...` resigns at the end of the block. */
  Campaign.prototype[asyncDispose] = async function dispose() { await this.resign(); };
}

// ---------------------------------------------------------------- client

/**
 * @typedef {object} ConnectOptions
 * @property {string} [socket] the agent's socket path; default: `LOCKAGENT_SOCKET`, then the default path
 * @property {string} [client] a name for this application, shown by `lockagent ctl list`
 * @property {number} [sessionTtlMs] how long the session (and its session-scoped leases) outlives a broken connection, 0 to 3600000; default 0
 * @property {number} [heartbeatMs] 0 (off, default) or 100 to 3600000: the agent drops a connection silent for that long; the client pings every third of it
 * @property {boolean} [reconnect] reconnect after a broken connection, resuming the session when it has a TTL; default true
 * @property {number} [reconnectMinMs] first delay between reconnection attempts; default 50
 * @property {number} [reconnectMaxMs] longest delay between reconnection attempts; default 2000
 * @property {number} [timeoutMs] how long a request waits for its answer, beyond an acquire's `waitMs`, before it rejects with an {@link AgentTimeoutError}; default 10000, `Infinity` for no limit (as is a bound, with `waitMs`, beyond about 24.8 days)
 */

/**
 * @typedef {object} AcquireOptions
 * @property {'exclusive'|'shared'} [mode] default `exclusive`
 * @property {number} [limit] with `shared`: at most this many shared holders
 * @property {'connection'|'session'} [scope] default `connection`
 * @property {number} [ttlMs] the backend lease duration; default the agent's
 * @property {string} [meta] free text shown to `inspect` and `lockagent ctl list`
 * @property {number} [waitMs] for `acquire`: how long to wait, `Infinity` (default) for as long as it takes
 * @property {AbortSignal} [signal] abandons the acquire; the promise rejects with `signal.reason`
 */

/**
 * A session with the agent over one connection at a time.
 *
 * Events:
 * - `'lost'` (lease: Lease, err: LeaseLostError): a lease was lost
 * - `'backend'` ({state, message}): renewals started failing (`degraded`) or recovered (`ok`)
 * - `'shutdown'` (message): the agent is stopping; every lease is lost
 * - `'disconnect'` (err): the connection broke; the client reconnects unless `reconnect` is false
 * - `'reconnect'` ({session, resumed}): connected again; `resumed` is false for a new session
 * - `'close'`: the client is closed for good
 */
class Client extends EventEmitter {
  /** @internal use {@link connect} */
  constructor(options = {}) {
    super();
    this._options = {
      client: '',
      sessionTtlMs: 0,
      heartbeatMs: 0,
      reconnect: true,
      reconnectMinMs: 50,
      reconnectMaxMs: 2000,
      ...options,
    };
    const { timeoutMs } = this._options;
    this._options.timeoutMs = timeoutMs === Infinity ? Infinity : intOption('timeoutMs', timeoutMs) ?? DEFAULT_TIMEOUT_MS;
    this._options.sessionTtlMs = intOption('sessionTtlMs', this._options.sessionTtlMs) ?? 0;
    this._options.heartbeatMs = intOption('heartbeatMs', this._options.heartbeatMs) ?? 0;
    /** @type {string} the socket path */
    this.socketPath = socketPath(options.socket);
    /** @type {string|null} the session id */
    this.session = null;
    /** @type {string|null} the session's resume token; keep it private */
    this.resumeToken = null;
    /** @type {object|null} what the agent said of itself in `hello`: version, backend, maxLineBytes, ttlMs */
    this.agent = null;
    this._sock = null;
    this._connected = false;
    this._closed = false;
    this._closing = null;
    this._saidBye = false;
    this._nextId = 0;
    this._pending = new Map();
    /** @type {Map<string, Lease>} */
    this._leases = new Map();
    /** @type {Map<string, Campaign>} by campaign id */
    this._campaigns = new Map();
    this._heartbeat = null;
    this._reconnecting = null;
    this._stopReconnect = new AbortController();
    this._readyWaiters = [];
    this._resumed = false;
    this._closeCause = null;
  }

  /** True while a connection is open and its session established. */
  get connected() { return this._connected; }

  /** True once `close()` was called. */
  get closed() { return this._closed; }

  /** The leases this client holds now. */
  get leases() { return [...this._leases.values()]; }

  /**
   * Resolves when the client is connected: at once if it is, else when it
   * has reconnected. Rejects if the client is (or gets) closed.
   * @param {{signal?: AbortSignal}} [options]
   */
  ready({ signal } = {}) {
    if (this._connected) return Promise.resolve();
    if (this._closed) return Promise.reject(closedError());
    signal?.throwIfAborted();
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject };
      const onAbort = () => {
        this._readyWaiters = this._readyWaiters.filter((w) => w !== waiter);
        reject(signal.reason);
      };
      waiter.resolve = () => { signal?.removeEventListener('abort', onAbort); resolve(); };
      waiter.reject = (err) => { signal?.removeEventListener('abort', onAbort); reject(err); };
      signal?.addEventListener('abort', onAbort, { once: true });
      this._readyWaiters.push(waiter);
    });
  }

  /** Waits up to `ms` for the client to be connected; resolves whether it is. */
  async _readyWithin(ms) {
    if (this._connected) return true;
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(), ms);
    try {
      await this.ready({ signal: stop.signal });
      return true;
    } catch {
      return false;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Takes a lock, waiting for it up to `waitMs` (as long as it takes by
   * default). Resolves with the Lease, or with null if `waitMs` ran out.
   * @param {string} name
   * @param {AcquireOptions} [options]
   * @returns {Promise<Lease|null>}
   */
  acquire(name, options = {}) {
    const { waitMs = Infinity } = options;
    return this._acquire(name, options, waitMs);
  }

  /**
   * Tries to take a lock without waiting. Resolves with the Lease, or with
   * null if the lock is held (or others queue for it).
   * @param {string} name
   * @param {AcquireOptions} [options]
   * @returns {Promise<Lease|null>}
   */
  tryAcquire(name, options = {}) {
    return this._acquire(name, options, 0);
  }

  async _acquire(name, options, waitMs) {
    const { mode, limit, scope, ttlMs, meta, signal } = options;
    signal?.throwIfAborted();
    const args = {
      name,
      mode,
      limit: intOption('limit', limit),
      scope,
      ttl_ms: intOption('ttlMs', ttlMs),
      wait_ms: waitMs === Infinity || waitMs === -1 ? -1 : intOption('waitMs', waitMs), // -1: the protocol's forever
      meta,
    };
    let lease = null;
    // The lease is tracked as its answer is read: the next line may be its
    // lost event.
    const { id, promise } = this._start('acquire', args, {
      onAnswer: (res) => {
        if (!res.acquired) return;
        lease = new Lease(this, res, meta);
        this._leases.set(lease.id, lease);
      },
    });
    let aborted = false;
    const onAbort = () => {
      aborted = true;
      this._call('cancel', { target: id }).catch(() => {});
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      let res;
      try {
        res = await promise;
      } catch (err) {
        if (aborted) throw signal.reason;
        throw err;
      }
      if (!res.acquired) {
        if (aborted) throw signal.reason;
        return null;
      }
      if (aborted) {
        await lease.release().catch(() => {});
        throw signal.reason;
      }
      return lease;
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
  }

  /**
   * Campaigns for leadership of a name. Resolves with the Campaign once
   * the agent has taken it; await `campaign.elected()` for a term.
   * @param {string} name
   * @param {{scope?: 'connection'|'session', ttlMs?: number, meta?: string}} [options]
   * @returns {Promise<Campaign>}
   */
  async campaign(name, options = {}) {
    const campaign = new Campaign(this, name, { ...options, ttlMs: intOption('ttlMs', options.ttlMs) });
    await campaign._start();
    return campaign;
  }

  /**
   * Who holds a name.
   * @param {string} name
   * @returns {Promise<{locked: boolean, mode: string|null, holders: Array<{mode: string, token: number, meta: string, host: string, expiresInMs: number}>, lastToken: number, queued: number}>}
   */
  async inspect(name) {
    const res = await this._call('inspect', { name });
    return {
      locked: res.locked,
      mode: res.mode,
      holders: res.holders.map(camelKeys),
      lastToken: res.last_token,
      queued: res.queued ?? 0,
    };
  }

  /**
   * The sessions of this uid (every session with `all`, for admins), with
   * their leases and waiting acquires; keys in camelCase.
   * @param {{all?: boolean}} [options]
   * @returns {Promise<object[]>}
   */
  async list({ all = false } = {}) {
    const sessions = [];
    const args = { all, limit: LIST_PAGE };
    for (;;) {
      const page = await this._call('list', args);
      sessions.push(...page.sessions);
      if (page.next == null) return sessions.map(camelKeys);
      args.after = page.next;
    }
  }

  /**
   * Ends every lease on a name, whoever holds it (admins only). Resolves
   * with how many were ended; each holder gets `lost` with reason `broken`.
   * @param {string} name
   * @returns {Promise<number>}
   */
  async break(name) {
    const res = await this._call('break', { name });
    return res.broken;
  }

  /**
   * A round trip to the agent. Resolves with its duration in milliseconds.
   * @returns {Promise<number>}
   */
  async ping() {
    const start = performance.now();
    await this._call('ping');
    return performance.now() - start;
  }

  /**
   * Sends any request and resolves with the agent's raw answer (the JSON
   * object, `id` and `ok` included). For ops this client has no method for.
   * @param {string} op
   * @param {object} [args]
   * @returns {Promise<object>}
   */
  request(op, args = {}) {
    return this._call(op, args);
  }

  /**
   * Ends the session: every lease of both scopes is released (`bye`), and
   * the connection closes. Pending calls reject with a ConnectionError.
   * A session with a grace period (`sessionTtlMs`) whose connection broke
   * is resumed on a new connection to be ended, so that its leases are
   * not left held for the grace period. Safe to call more than once: every
   * call resolves when the close is complete (they share one promise).
   * @returns {Promise<void>}
   */
  close() {
    this._closing ??= this._close();
    return this._closing;
  }

  async _close() {
    const closedBefore = this._closed;
    this._closed = true;
    this._stopReconnect.abort();
    // A reconnect under way ends first (a resume it completes is closed).
    if (this._reconnecting) {
      let timer;
      await Promise.race([
        this._reconnecting.catch(() => {}),
        new Promise((resolve) => { timer = setTimeout(resolve, END_WAIT_MS); }),
      ]);
      clearTimeout(timer);
    }
    if (this._connected) {
      try {
        await this._call('bye', {}, { closing: true });
        this._saidBye = true;
      } catch {
        // The connection is gone either way.
      }
    }
    if (!this._saidBye && this.session && this._options.sessionTtlMs > 0) await this._endDetached();
    for (const campaign of [...this._campaigns.values()]) campaign._end(null);
    for (const lease of [...this._leases.values()]) lease._end(null);
    this._stopHeartbeat();
    this._connected = false;
    this._sock?.destroy();
    this._failPending(closedError());
    for (const w of this._readyWaiters.splice(0)) w.reject(closedError());
    if (!closedBefore) this.emit('close'); // else the break closed it, and said so
  }

  // ----------------------------------------------------------- internals

  /**
   * Ends a session whose connection broke: resumes it on a new connection
   * and says `bye` (should the session be gone, the `bye` ends the new
   * one), within END_WAIT_MS.
   */
  async _endDetached() {
    const { client, sessionTtlMs } = this._options;
    const hello = {
      id: 'end-hello', op: 'hello', version: PROTOCOL_VERSION, client, session_ttl_ms: sessionTtlMs,
      resume: { session: this.session, token: this.resumeToken },
    };
    let sock;
    try {
      sock = await dial(this.socketPath);
    } catch {
      return; // no agent: nothing to end
    }
    await new Promise((resolve) => {
      const timer = setTimeout(() => sock.destroy(), END_WAIT_MS);
      sock.on('error', () => {});
      sock.on('close', () => { clearTimeout(timer); resolve(); });
      sock.resume(); // the answers are not read: the agent closes after bye
      sock.write(`${JSON.stringify(hello)}\n${JSON.stringify({ id: 'end-bye', op: 'bye' })}\n`);
    });
  }

  /** Sends a request; resolves with the answer, rejects with its error. */
  _call(op, args = {}, opts = {}) {
    return this._start(op, args, opts).promise;
  }

  /**
   * Sends a request and returns its id with the promise of its answer.
   * `onAnswer`, if given, is called with a successful answer as soon as it
   * is read, before the lines after it.
   */
  _start(op, args, { handshake = false, closing = false, onAnswer } = {}) {
    const id = `r${++this._nextId}`;
    if (this._closed && !closing) return { id, promise: Promise.reject(closedError()) };
    if (!this._connected && !handshake) {
      return {
        id,
        promise: Promise.reject(new ConnectionError('not connected to the agent', 'not_connected')),
      };
    }
    const line = JSON.stringify({ id, op, ...args });
    if (LONE_SURROGATE.test(line)) {
      const field = Object.keys(args).find((k) => LONE_SURROGATE.test(JSON.stringify(args[k]) ?? '')) ?? 'a string';
      return {
        id,
        promise: Promise.reject(new LockAgentError(
          `${op}: ${field} is not well-formed: it has a lone surrogate, which the agent refuses`, 'invalid_argument')),
      };
    }
    const max = this.agent?.maxLineBytes;
    if (max && Buffer.byteLength(line) > max) {
      return {
        id,
        promise: Promise.reject(new LockAgentError(
          `${op}: the request is longer than the agent's ${max}-byte line limit`, 'line_too_long')),
      };
    }
    const promise = new Promise((resolve, reject) => {
      // A waiting acquire is answered out of order (see _onLine).
      const waiting = op === 'acquire' && args.wait_ms != null && args.wait_ms !== 0;
      const pending = { op, waiting, resolve, reject, onAnswer, timer: null, abandoned: false };
      const bound = this._callTimeout(op, args);
      if (bound !== null) {
        // Given up, it stays pending: its answer, should one come, is
        // read in order and given back (see _onLine).
        pending.timer = setTimeout(() => {
          pending.abandoned = true;
          reject(new AgentTimeoutError(op, bound));
        }, bound);
      }
      this._pending.set(id, pending);
    });
    this._sock.write(`${line}\n`);
    return { id, promise };
  }

  /** How long a request waits for its answer, or null for no limit. */
  _callTimeout(op, args) {
    const { timeoutMs } = this._options;
    const wait = op === 'acquire' ? (args.wait_ms ?? 0) : 0;
    if (wait < 0 || timeoutMs + wait > MAX_TIMER_MS) return null;
    return timeoutMs + wait;
  }

  /** Connects and opens (or resumes) the session. */
  async _open() {
    const sock = await dial(this.socketPath);
    this._sock = sock;
    this._closeCause = null;
    sock.setEncoding('utf8');
    let buffered = '';
    sock.on('data', (chunk) => {
      buffered += chunk;
      let nl;
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        if (sock === this._sock) this._onLine(line);
      }
    });
    sock.on('error', (err) => { if (sock === this._sock) this._closeCause ??= err; });
    sock.on('close', () => this._onClose(sock));
    try {
      await this._hello();
    } catch (err) {
      sock.destroy();
      throw err;
    }
    // Connected once the handshake (a resume's checks included) is done:
    // until then the application's calls wait, and a break is the
    // handshake's to handle.
    this._connected = true;
    if (this._closed) {
      this._connected = false;
      sock.destroy();
      throw closedError();
    }
    this._startHeartbeat();
    for (const w of this._readyWaiters.splice(0)) w.resolve();
  }

  /** Says hello, resuming the session if it has one worth resuming. */
  async _hello() {
    const { client, sessionTtlMs, heartbeatMs } = this._options;
    const args = {
      version: PROTOCOL_VERSION,
      client,
      session_ttl_ms: sessionTtlMs,
      heartbeat_ms: heartbeatMs,
    };
    if (this.session && sessionTtlMs > 0) {
      try {
        await this._call('hello', { ...args, resume: { session: this.session, token: this.resumeToken } },
          { handshake: true, onAnswer: (res) => this._helloDone(res) });
        await this._checkSessionLeases();
        return;
      } catch (err) {
        if (err.code !== 'session_expired') throw err;
        // The session is gone, and every lease it had with it (released,
        // for those whose release went down with the connection).
        for (const lease of [...this._leases.values()]) {
          lease._end(lease._releaseSent ? null : new LeaseLostError(lease, 'session_expired'));
        }
      }
    }
    await this._call('hello', args, { handshake: true, onAnswer: (res) => this._helloDone(res) });
  }

  /**
   * After a resume, asks after each session-scoped lease the client holds:
   * a lost event sent to the connection that broke never arrived, and a
   * lease the session no longer has is lost (released, if a release of it
   * went down with the connection). Then gives back the leases of
   * the session it does not know.
   */
  async _checkSessionLeases() {
    for (const lease of [...this._leases.values()]) {
      if (lease.scope !== 'session' || !lease.held) continue;
      let res;
      try {
        res = await this._call('check', { lease: lease.id }, { handshake: true });
      } catch (err) {
        if (!(err instanceof AgentError)) throw err;
        // The backend cannot say now (backend_unavailable): the lease
        // stays, and its renewals or a later check tell.
        res = { held: err.code !== 'not_held' };
      }
      // A release whose answer went down with the connection was done.
      if (!res.held) lease._end(lease._releaseSent ? null : new LeaseLostError(lease, 'expired'));
      lease._releaseSent = false;
    }
    // A lease the session has and the client does not know was granted to
    // a request whose answer went down with the connection: give it back.
    // A campaign started so is resigned, which ends its term too.
    let mine;
    for (const args = { limit: LIST_PAGE }; ; ) {
      const page = await this._call('list', args, { handshake: true });
      mine ??= (page.sessions ?? []).find((s) => s.session === this.session);
      if (mine || page.next == null) break;
      args.after = page.next;
    }
    const terms = new Set();
    for (const c of mine?.campaigns ?? []) {
      if (this._campaigns.has(c.campaign)) {
        if (c.lease) terms.add(c.lease);
        continue;
      }
      try {
        await this._call('resign', { campaign: c.campaign }, { handshake: true });
      } catch (err) {
        if (!(err instanceof AgentError)) throw err;
      }
      if (c.lease) terms.add(c.lease);
    }
    for (const { lease } of mine?.leases ?? []) {
      if (this._leases.has(lease) || terms.has(lease)) continue;
      try {
        await this._call('release', { lease }, { handshake: true });
      } catch (err) {
        if (!(err instanceof AgentError)) throw err;
      }
    }
  }

  /**
   * Records the session as the hello answer is read, before the events
   * that may follow it (those missed while the session was detached).
   */
  _helloDone(res) {
    this.session = res.session;
    this.resumeToken = res.resume_token;
    this.agent = {
      version: res.agent.version,
      backend: res.agent.backend,
      maxLineBytes: res.agent.max_line_bytes,
      ttlMs: { ...res.agent.ttl_ms },
    };
    this._resumed = res.resumed;
  }

  _onLine(line) {
    if (line.trim() === '') return;
    let msg;
    try {
      msg = JSON.parse(line);
    } catch {
      this._closeCause = new LockAgentError(`the agent sent a line that is not JSON: ${line.slice(0, 100)}`, 'bad_response');
      this._sock.destroy();
      return;
    }
    if (msg === null || typeof msg !== 'object') return;
    if (typeof msg.event === 'string') {
      this._onEvent(msg);
      return;
    }
    let key = msg.id === null || msg.id === undefined ? undefined : String(msg.id);
    if (key === undefined && msg.ok === false && msg.error && !CONNECTION_ERRORS.has(msg.error.code)) {
      // A line of ours the agent could not decode (bad_request). Such
      // lines are answered in order, as every request but a waiting
      // acquire: the answer is the oldest pending request's, unless a
      // waiting acquire came before it. Should it be unclear whose it is,
      // the connection is closed, and every pending request rejects.
      key = this._oldestInOrder();
      if (key === undefined) {
        this._closeCause = new AgentError('connection', msg.error);
        this._sock.destroy();
        return;
      }
    }
    const pending = key === undefined ? undefined : this._pending.get(key);
    if (!pending) {
      // An answer to no request of ours: an error about the connection
      // itself (line_too_long, too many connections), which is about to end.
      if (key === undefined && msg.ok === false && msg.error) this._closeCause = new AgentError('connection', msg.error);
      return;
    }
    this._pending.delete(key);
    clearTimeout(pending.timer);
    if (pending.abandoned) {
      // Its caller gave up: what it was granted goes back.
      if (msg.ok && pending.op === 'acquire' && msg.acquired) this._call('release', { lease: msg.lease }).catch(() => {});
      if (msg.ok && pending.op === 'campaign') this._call('resign', { campaign: msg.campaign }).catch(() => {});
      return;
    }
    if (msg.ok) {
      pending.onAnswer?.(msg);
      pending.resolve(msg);
      return;
    }
    let lease;
    if (msg.error.lease) lease = this._leases.get(msg.error.lease.lease) ?? camelKeys(msg.error.lease);
    pending.reject(new AgentError(pending.op, msg.error, lease));
  }

  /** The id of the pending request an answer with `"id": null` is for, if that is certain. */
  _oldestInOrder() {
    const [first, second] = this._pending.entries();
    if (!first || (first[1].waiting && second)) return undefined;
    return first[0];
  }

  _onEvent(ev) {
    switch (ev.event) {
      case 'lost': {
        const lease = this._leases.get(ev.lease);
        if (lease) lease._end(new LeaseLostError(lease, ev.reason));
        break;
      }
      case 'elected': {
        const campaign = this._campaigns.get(ev.campaign);
        if (campaign && !campaign.ended) campaign._elected(ev);
        break;
      }
      case 'backend':
        this.emit('backend', { state: ev.state, message: ev.message });
        break;
      case 'shutdown':
        for (const lease of [...this._leases.values()]) lease._end(new LeaseLostError(lease, 'shutdown'));
        this.emit('shutdown', ev.message);
        break;
      default:
        // Events of later versions are ignored.
        break;
    }
  }

  _onClose(sock) {
    if (sock !== this._sock) return;
    const wasConnected = this._connected;
    this._connected = false;
    this._stopHeartbeat();
    const err = new ConnectionError('the connection to the agent was closed', 'connection_closed',
      this._closeCause ? { cause: this._closeCause } : undefined);
    this._closeCause = null;
    this._failPending(err);
    if (this._closed || !wasConnected) return;
    // The documented contract: a broken connection loses every
    // connection-scoped lease, and the session's too if it has no TTL.
    const keepSession = this._options.sessionTtlMs > 0 && this._options.reconnect;
    for (const lease of [...this._leases.values()]) {
      if (lease.scope === 'connection' || !keepSession) lease._end(new LeaseLostError(lease, 'disconnected'));
    }
    this.emit('disconnect', err);
    if (this._closed) return;
    if (this._options.reconnect) {
      this._reconnecting = this._reconnectLoop();
    } else {
      this._closed = true;
      for (const w of this._readyWaiters.splice(0)) w.reject(closedError());
      this.emit('close');
    }
  }

  async _reconnectLoop() {
    const { reconnectMinMs, reconnectMaxMs } = this._options;
    let delay = reconnectMinMs;
    while (!this._closed) {
      try {
        await this._open();
        this._reconnecting = null;
        this.emit('reconnect', { session: this.session, resumed: this._resumed });
        await this._campaignAgain();
        return;
      } catch {
        if (this._closed) return;
      }
      const jittered = delay / 2 + Math.random() * delay / 2;
      delay = Math.min(delay * 2, reconnectMaxMs);
      await new Promise((resolve) => {
        const signal = this._stopReconnect.signal;
        const timer = setTimeout(done, jittered);
        function done() {
          clearTimeout(timer);
          signal.removeEventListener('abort', done);
          resolve();
        }
        signal.addEventListener('abort', done, { once: true });
      });
    }
  }

  /** Starts again the campaigns the agent ended with the connection. */
  async _campaignAgain() {
    const keptBySession = this._resumed;
    for (const campaign of [...this._campaigns.values()]) {
      if (campaign.ended || (keptBySession && campaign.scope === 'session')) continue;
      this._campaigns.delete(campaign.id);
      try {
        await campaign._start();
      } catch (err) {
        if (err instanceof AgentError) {
          campaign._end(err);
          continue;
        }
        // Otherwise the connection broke again: the next reconnect retries.
        this._campaigns.set(campaign.id, campaign);
        if (err.code === 'agent_timeout') {
          // The agent does not answer, and a late answer is resigned: the
          // connection is given up, and the next one campaigns again.
          this._sock?.destroy();
          return;
        }
      }
    }
  }

  _failPending(err) {
    const pending = [...this._pending.values()];
    this._pending.clear();
    for (const p of pending) {
      clearTimeout(p.timer);
      p.reject(err);
    }
  }

  _startHeartbeat() {
    const { heartbeatMs } = this._options;
    if (!heartbeatMs) return;
    this._heartbeat = setInterval(() => {
      this._call('ping').catch(() => {});
    }, Math.max(heartbeatMs / 3, 10));
    this._heartbeat.unref();
  }

  _stopHeartbeat() {
    clearInterval(this._heartbeat);
    this._heartbeat = null;
  }
}
if (asyncDispose) {
  /** `await using client = await connect()` closes the client at the end of the block. */
  Client.prototype[asyncDispose] = async function dispose() { await this.close(); };
}

/**
 * Connects to the agent and opens a session.
 * @param {ConnectOptions} [options]
 * @returns {Promise<Client>}
 */
async function connect(options = {}) {
  const client = new Client(options);
  await client._open();
  return client;
}

function dial(socket) {
  return new Promise((resolve, reject) => {
    const failed = (err) => new ConnectionError(`cannot connect to the agent at ${socket}: ${err.message}`, 'connect_failed', { cause: err });
    try {
      checkPrivate(socket);
    } catch (err) {
      reject(failed(err));
      return;
    }
    const sock = net.createConnection(socket);
    const onError = (err) => reject(failed(err));
    sock.once('error', onError);
    sock.once('connect', () => {
      sock.removeListener('error', onError);
      resolve(sock);
    });
  });
}

/**
 * A number option as the protocol takes it, an integer: absent stays
 * absent, a fraction is rounded up; NaN, an infinity, a negative number or
 * a non-number is refused (`invalid_argument`).
 */
function intOption(name, value) {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new LockAgentError(`${name} must be a finite number, 0 or more, not ${String(value)}`, 'invalid_argument');
  }
  return Math.ceil(value);
}

function closedError() {
  return new ConnectionError('the client is closed', 'connection_closed');
}

/** A copy of a wire object with its snake_case keys in camelCase, deeply. */
function camelKeys(value) {
  if (Array.isArray(value)) return value.map(camelKeys);
  if (value === null || typeof value !== 'object') return value;
  const out = {};
  for (const [k, v] of Object.entries(value)) {
    out[k.replace(/_([a-z])/g, (_, c) => c.toUpperCase())] = camelKeys(v);
  }
  return out;
}

module.exports = {
  connect,
  Client,
  Lease,
  Campaign,
  LockAgentError,
  AgentError,
  ConnectionError,
  AgentTimeoutError,
  LeaseLostError,
  defaultSocketPath,
  socketPath,
  PROTOCOL_VERSION,
};
