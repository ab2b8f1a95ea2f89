// Type declarations of lockagent.js, the lockagent client for Node.js.
// Every name lockagent.js exports is declared here, and only those; the
// fields of the protocol's answers are in camelCase, as the client gives them.

/// <reference types="node" />

import { EventEmitter } from 'node:events';

/** The protocol version this client speaks. */
export declare const PROTOCOL_VERSION: 1;

/**
 * The socket path the agent listens on by default, computed as the agent
 * does: `/run/lockagent/agent.sock` for root and systemd services, else
 * `$XDG_RUNTIME_DIR/lockagent.sock`, else `$TMPDIR/lockagent-UID/agent.sock`.
 */
export declare function defaultSocketPath(env?: NodeJS.ProcessEnv, euid?: number): string;

/**
 * Where a client finds the agent: the explicit path if given, then the
 * `LOCKAGENT_SOCKET` environment variable, then {@link defaultSocketPath}.
 */
export declare function socketPath(explicit?: string, env?: NodeJS.ProcessEnv): string;

/** Connects to the agent and opens a session. */
export declare function connect(options?: ConnectOptions): Promise<Client>;

export type LockMode = 'exclusive' | 'shared';
export type LeaseScope = 'connection' | 'session';

export interface ConnectOptions {
  /** The agent's socket path; default: `LOCKAGENT_SOCKET`, then the default path. */
  socket?: string;
  /** A name for this application, shown by `lockagent ctl list`. */
  client?: string;
  /** How long the session (and its session-scoped leases) outlives a broken connection, 0 to 3600000; default 0. */
  sessionTtlMs?: number;
  /** 0 (off, default) or 100 to 3600000: the agent drops a connection silent for that long; the client pings every third of it. */
  heartbeatMs?: number;
  /** Reconnect after a broken connection, resuming the session when it has a TTL; default true. */
  reconnect?: boolean;
  /** First delay between reconnection attempts; default 50. */
  reconnectMinMs?: number;
  /** Longest delay between reconnection attempts; default 2000. */
  reconnectMaxMs?: number;
  /** How long a request waits for its answer, beyond an acquire's `waitMs`; default 10000, `Infinity` for no limit. */
  timeoutMs?: number;
}

export interface AcquireOptions {
  /** Default `exclusive`. */
  mode?: LockMode;
  /** With `shared`: at most this many shared holders. */
  limit?: number;
  /** Default `connection`. */
  scope?: LeaseScope;
  /** The backend lease duration; default the agent's. */
  ttlMs?: number;
  /** Free text shown to `inspect` and `lockagent ctl list`. */
  meta?: string;
  /** For `acquire`: how long to wait, `Infinity` (default) or -1 for as long as it takes. */
  waitMs?: number;
  /** Abandons the acquire; the promise rejects with `signal.reason`. */
  signal?: AbortSignal;
}

export interface CampaignOptions {
  /** Of the campaign and of each term's lease; default `connection`. */
  scope?: LeaseScope;
  /** Each term's lease duration; default the agent's. */
  ttlMs?: number;
  /** Each term's meta. */
  meta?: string;
}

/** What the agent said of itself in `hello`. */
export interface AgentInfo {
  version: string;
  backend: string;
  /** The longest request line the agent reads, in bytes. */
  maxLineBytes: number;
  /** Lease durations: the default, and the bounds of `ttlMs`. */
  ttlMs: { default: number; min: number; max: number };
}

/** The fields of a lease, as the agent sends them (`AgentError.lease` when the client does not know it). */
export interface LeaseFields {
  lease: string;
  name: string;
  mode: LockMode;
  scope: LeaseScope;
  token: number;
  ttlMs: number;
}

/** A live lease on a name, as `inspect` reports it. */
export interface Holder {
  mode: LockMode;
  token: number;
  meta: string;
  host: string;
  expiresInMs: number;
}

/** What `inspect` reports about a name. */
export interface LockInfo {
  locked: boolean;
  mode: LockMode | null;
  /** The live leases, sorted by token. */
  holders: Holder[];
  /** The last token granted for the name; 0 if none is known. */
  lastToken: number;
  /** How many waiting acquires (and campaigns) queue for the name, on every agent. */
  queued: number;
}

/** What `lease.check()` reports: confirmed with the backend at the time of the call. */
export interface CheckResult {
  held: boolean;
  token: number;
  expiresInMs: number;
}

/** A session, as `list` reports it. */
export interface SessionInfo {
  session: string;
  /** The peer of the session's latest connection. */
  pid: number;
  uid: number;
  client: string;
  /** False while the session waits to be resumed. */
  attached: boolean;
  leases: Array<LeaseFields & { meta: string; heldForMs: number; expiresInMs: number }>;
  waiting: Array<{ name: string; mode: LockMode; waitedMs: number }>;
  campaigns: Array<{ campaign: string; name: string; leader: boolean; lease?: string }>;
}

/**
 * The base class of every error this module throws. `code` is a stable
 * string: one of the protocol's error codes for an {@link AgentError}, or
 * one of this client's own (`connection_closed`, `not_connected`,
 * `connect_failed`, `agent_timeout`, `line_too_long`, `invalid_argument`,
 * `lease_lost`, `lease_released`, `campaign_ended`).
 */
export declare class LockAgentError extends Error {
  constructor(message: string, code: string, options?: { cause?: unknown });
  code: string;
}

/**
 * An error answered by the agent: `code` is the protocol's error code,
 * `op` the request's op. For `already_held`, `lease` is the lease the
 * session already holds on the name: the client's Lease if it knows it.
 */
export declare class AgentError extends LockAgentError {
  constructor(op: string, error: { code: string; message: string }, lease?: Lease | LeaseFields);
  op: string;
  /** The agent's message. */
  agentMessage: string;
  lease?: Lease | LeaseFields;
}

/**
 * The connection to the agent ended, or there was none, before an answer:
 * `code` is `connection_closed`, `not_connected` or `connect_failed` (the
 * system's error in `cause`).
 */
export declare class ConnectionError extends LockAgentError {
  constructor(message: string, code: string, options?: { cause?: unknown });
}

/** The agent did not answer within the client's `timeoutMs`: `code` is `agent_timeout`. */
export declare class AgentTimeoutError extends LockAgentError {
  constructor(op: string, ms: number);
  op: string;
}

/**
 * A lease was lost. `reason` is the agent's (`expired`, `broken`,
 * `taken_over`, `backend_unavailable`) or the client's own
 * (`disconnected`, `session_expired`, `shutdown`).
 */
export declare class LeaseLostError extends LockAgentError {
  constructor(lease: Lease, reason: string);
  reason: string;
  lease: Lease;
}

/**
 * A granted lock. It is valid only while `held` is true: lost, it aborts
 * `signal`, resolves `ended` and emits `'lost'`.
 */
export declare class Lease extends EventEmitter {
  private constructor();
  /** The lease id. */
  readonly id: string;
  readonly name: string;
  readonly mode: LockMode;
  readonly scope: LeaseScope;
  /** The fencing token: larger for every later grant of the name. */
  readonly token: number;
  readonly ttlMs: number;
  readonly meta: string;
  /** Why the lease was lost, null while it was not. */
  readonly lostReason: string | null;
  /** True once released (by `release()` or `client.close()`). */
  readonly released: boolean;
  /** Resolves once the lease is no longer held: with its LeaseLostError if lost, null if released. Never rejects. */
  readonly ended: Promise<LeaseLostError | null>;
  /** True while the lease is neither lost nor released. */
  get held(): boolean;
  /** True once the lease is lost. */
  get lost(): boolean;
  /** Aborts when the lease stops being held; its reason says why. */
  get signal(): AbortSignal;
  /** Throws the LeaseLostError if the lease is lost. */
  throwIfLost(): void;
  /** Releases the lease: true if this call released it, false if it had already ended. */
  release(): Promise<boolean>;
  /** Asks the agent to confirm with its backend that the lease is still held. */
  check(): Promise<CheckResult>;
  /** Releases the lease at the end of an `await using` block (where the runtime has `Symbol.asyncDispose`). */
  [Symbol.asyncDispose](): Promise<void>;

  on(event: 'lost', listener: (err: LeaseLostError) => void): this;
  once(event: 'lost', listener: (err: LeaseLostError) => void): this;
  off(event: 'lost', listener: (err: LeaseLostError) => void): this;
}

/**
 * A standing bid for leadership of a name. Each time it wins, the agent
 * grants it a term, an exclusive Lease; when the term ends the campaign
 * contends again on its own, until `resign()`.
 */
export declare class Campaign extends EventEmitter {
  private constructor();
  /** The campaign id; a new one after a reconnect. */
  readonly id: string;
  readonly name: string;
  /** True once the campaign has ended. */
  readonly ended: boolean;
  /** The current term, null while not leader. */
  get leader(): Lease | null;
  /** The terms' scope. */
  get scope(): LeaseScope;
  /**
   * Resolves with the current term if this campaign leads, else with the
   * next one it wins; rejects with `signal.reason` on abort, and with a
   * LockAgentError (`campaign_ended`) if the campaign ends first.
   */
  elected(options?: { signal?: AbortSignal }): Promise<Lease>;
  /** Stops contending and releases the current term, if any. */
  resign(): Promise<void>;
  /** Resigns at the end of an `await using` block. */
  [Symbol.asyncDispose](): Promise<void>;

  on(event: 'elected', listener: (term: Lease) => void): this;
  on(event: 'end', listener: (err: LockAgentError | null) => void): this;
  once(event: 'elected', listener: (term: Lease) => void): this;
  once(event: 'end', listener: (err: LockAgentError | null) => void): this;
  off(event: 'elected', listener: (term: Lease) => void): this;
  off(event: 'end', listener: (err: LockAgentError | null) => void): this;
}

/** A session with the agent over one connection at a time; made by {@link connect}. */
export declare class Client extends EventEmitter {
  private constructor();
  /** The socket path. */
  readonly socketPath: string;
  /** The session id. */
  readonly session: string | null;
  /** The session's resume token; keep it private. */
  readonly resumeToken: string | null;
  /** What the agent said of itself in `hello`. */
  readonly agent: AgentInfo | null;
  /** True while a connection is open and its session established. */
  get connected(): boolean;
  /** True once `close()` was called. */
  get closed(): boolean;
  /** The leases this client holds now. */
  get leases(): Lease[];
  /** Resolves when the client is connected; rejects if it is (or gets) closed. */
  ready(options?: { signal?: AbortSignal }): Promise<void>;
  /** Takes a lock, waiting up to `waitMs` (as long as it takes by default): the Lease, or null if the wait ran out. */
  acquire(name: string, options?: AcquireOptions): Promise<Lease | null>;
  /** Tries to take a lock without waiting: the Lease, or null if it is held (or others queue for it). */
  tryAcquire(name: string, options?: Omit<AcquireOptions, 'waitMs'>): Promise<Lease | null>;
  /** Campaigns for leadership of a name; await `campaign.elected()` for a term. */
  campaign(name: string, options?: CampaignOptions): Promise<Campaign>;
  /** Who holds a name. */
  inspect(name: string): Promise<LockInfo>;
  /** The sessions of this uid (every session with `all`, for admins). */
  list(options?: { all?: boolean }): Promise<SessionInfo[]>;
  /** Ends every lease on a name (admins only): how many were ended. */
  break(name: string): Promise<number>;
  /** A round trip to the agent: its duration in milliseconds. */
  ping(): Promise<number>;
  /** Sends any request: the agent's raw answer, `id` and `ok` included. */
  request(op: string, args?: Record<string, unknown>): Promise<Record<string, unknown>>;
  /** Ends the session (every lease is released) and the connection. */
  close(): Promise<void>;
  /** Closes the client at the end of an `await using` block. */
  [Symbol.asyncDispose](): Promise<void>;

  on(event: 'lost', listener: (lease: Lease, err: LeaseLostError) => void): this;
  on(event: 'backend', listener: (state: { state: 'degraded' | 'ok'; message: string }) => void): this;
  on(event: 'shutdown', listener: (message: string) => void): this;
  on(event: 'disconnect', listener: (err: ConnectionError) => void): this;
  on(event: 'reconnect', listener: (info: { session: string; resumed: boolean }) => void): this;
  on(event: 'close', listener: () => void): this;
  once(event: 'lost', listener: (lease: Lease, err: LeaseLostError) => void): this;
  once(event: 'backend', listener: (state: { state: 'degraded' | 'ok'; message: string }) => void): this;
  once(event: 'shutdown', listener: (message: string) => void): this;
  once(event: 'disconnect', listener: (err: ConnectionError) => void): this;
  once(event: 'reconnect', listener: (info: { session: string; resumed: boolean }) => void): this;
  once(event: 'close', listener: () => void): this;
  off(event: 'lost', listener: (lease: Lease, err: LeaseLostError) => void): this;
  off(event: 'backend', listener: (state: { state: 'degraded' | 'ok'; message: string }) => void): this;
  off(event: 'shutdown', listener: (message: string) => void): this;
  off(event: 'disconnect', listener: (err: ConnectionError) => void): this;
  off(event: 'reconnect', listener: (info: { session: string; resumed: boolean }) => void): this;
  off(event: 'close', listener: () => void): this;
}
