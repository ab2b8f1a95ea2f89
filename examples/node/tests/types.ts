// The declarations' test: TypeScript that uses the whole API, compiled
// (never run) with tsc --noEmit --strict against the installed package.
// Each @ts-expect-error line is a misuse the declarations must refuse: tsc
// fails if one compiles.

import {
  AgentError,
  AgentTimeoutError,
  Campaign,
  Client,
  ConnectionError,
  Lease,
  LeaseLostError,
  LockAgentError,
  PROTOCOL_VERSION,
  connect,
  defaultSocketPath,
  socketPath,
} from 'lockagent';
import type { AgentInfo, CheckResult, LockInfo, SessionInfo } from 'lockagent';

declare function writeInvoice(order: { fencingToken: number; signal: AbortSignal }): Promise<void>;

async function invoices(): Promise<void> {
  const client: Client = await connect({ client: 'billing-worker', heartbeatMs: 5000, sessionTtlMs: 30_000 });
  const lease = await client.acquire('orders/42', { waitMs: 10_000, meta: 'invoice run' });
  if (lease) {
    try {
      await writeInvoice({ fencingToken: lease.token, signal: lease.signal });
      lease.throwIfLost();
    } finally {
      const released: boolean = await lease.release();
      void released;
    }
  }
  const shared = await client.tryAcquire('reports', { mode: 'shared', limit: 3, scope: 'session', ttlMs: 5000 });
  if (shared !== null) {
    const mode: 'exclusive' | 'shared' = shared.mode;
    const checked: CheckResult = await shared.check();
    const ended: LeaseLostError | null = await shared.ended;
    console.log(mode, checked.expiresInMs, ended?.reason, shared.held, shared.lost, shared.lostReason);
    // @ts-expect-error: a lease's fields are the agent's, not the application's.
    shared.token = 1;
  }
  const abort = new AbortController();
  await client.acquire('orders/43', { signal: abort.signal, waitMs: Infinity });
  // @ts-expect-error: a lock's name is a string.
  await client.acquire(42);
  // @ts-expect-error: the modes are exclusive and shared.
  await client.acquire('orders/44', { mode: 'read' });

  client.on('lost', (l: Lease, err: LeaseLostError) => console.error(l.name, err.reason, err.lease.token));
  client.on('backend', ({ state, message }) => console.warn(state === 'degraded', message));
  client.on('reconnect', ({ session, resumed }) => console.log(session, resumed));
  client.on('disconnect', (err: ConnectionError) => console.log(err.code));
  client.once('close', () => console.log('closed'));
  // @ts-expect-error: a lost listener is given the lease first, then the error.
  client.on('lost', (err: LeaseLostError, l: Lease) => console.log(err, l));
  // @ts-expect-error: a client has no such event.
  client.on('elected', () => {});

  const info: LockInfo = await client.inspect('orders/42');
  for (const holder of info.holders) console.log(holder.token, holder.host, holder.expiresInMs, info.lastToken);
  const sessions: SessionInfo[] = await client.list({ all: true });
  for (const s of sessions) console.log(s.session, s.pid, s.attached, s.leases.map((l) => l.heldForMs), s.waiting, s.campaigns);
  const broken: number = await client.break('orders/42');
  const ms: number = await client.ping();
  const raw = await client.request('status');
  console.log(broken, ms, raw.ok, client.session, client.connected, client.closed, client.leases.length);
  const agent: AgentInfo | null = client.agent;
  console.log(agent?.ttlMs.default, agent?.maxLineBytes);
  await client.ready({ signal: AbortSignal.timeout(1000) });
  await client.close();
}

async function leader(): Promise<void> {
  const client = await connect();
  const campaign: Campaign = await client.campaign('jobs/report', { scope: 'connection', ttlMs: 10_000, meta: 'reporter' });
  campaign.on('elected', (term: Lease) => console.log('leading with token', term.token));
  campaign.on('end', (err: LockAgentError | null) => console.log('ended', err?.code));
  const term: Lease = await campaign.elected({ signal: AbortSignal.timeout(60_000) });
  console.log(term.token, campaign.leader === term, campaign.ended, campaign.scope, campaign.id);
  await campaign.resign();
  await client.close();
}

async function usingBlocks(): Promise<void> {
  await using client = await connect({ socket: socketPath(undefined, process.env) });
  await using lease = await client.acquire('orders/45');
  console.log(lease?.id);
}

function errors(err: unknown): string {
  if (err instanceof AgentError) return `${err.op}: ${err.code}: ${err.agentMessage} ${err.lease?.token ?? ''}`;
  if (err instanceof AgentTimeoutError) return `${err.op} timed out`;
  if (err instanceof ConnectionError) return `${err.code}: ${String(err.cause)}`;
  if (err instanceof LockAgentError) return err.code;
  return String(err);
}

// @ts-expect-error: clients are made by connect().
new Client();

const version: 1 = PROTOCOL_VERSION;
console.log(version, defaultSocketPath(), defaultSocketPath({ XDG_RUNTIME_DIR: '/run/user/1000' }, 1000));
void invoices().catch((err) => console.error(errors(err)));
void leader();
void usingBlocks();
