// Package backendtest is the conformance suite of backend.Backend. Every
// backend's tests call Run, which checks the contract of package backend:
// conflicts between modes, semaphores, idempotent acquires, fencing tokens,
// ownership of renew and release, expiry, inspect, watch, cancellation and
// close. It tests the contract only, never an implementation's internals.
//
// It runs in real time (a few seconds in all), because some backends keep
// time outside the process: expiries use TTLs of a fraction of a second and
// are awaited by polling with a deadline.
package backendtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/backend"
)

const (
	// ttl is long enough that no lease expires unless a test means it to.
	ttl = 10 * time.Second
	// shortTTL is for the leases that a test waits to see expire.
	shortTTL = 300 * time.Millisecond
	// waitFor bounds every poll; tick is its interval.
	waitFor = 5 * time.Second
	tick    = 5 * time.Millisecond
	// quiet is how long a watch must stay silent to count as not notified.
	quiet = 50 * time.Millisecond
)

// Run checks the backend contract against fresh backends from open, one per
// subtest. open must return a backend in which no name was ever locked, and
// arrange for it to be closed when t ends (t.Cleanup); that Close may return
// ErrClosed, as the suite closes some backends itself.
func Run(t *testing.T, open func(t *testing.T) backend.Backend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b backend.Backend)
	}{
		{"Conflicts", testConflicts},
		{"Semaphore", testSemaphore},
		{"RetryIn", testRetryIn},
		{"IdempotentAcquire", testIdempotentAcquire},
		{"LeaseIDInOtherMode", testLeaseIDInOtherMode},
		{"InvalidRequest", testInvalidRequest},
		{"TokensIncrease", testTokensIncrease},
		{"ReleaseNotHeld", testReleaseNotHeld},
		{"ReleasesFirst", testReleasesFirst},
		{"RenewBatch", testRenewBatch},
		{"ExpiryFreesName", testExpiryFreesName},
		{"RenewKeepsAlive", testRenewKeepsAlive},
		{"RenewTakenOver", testRenewTakenOver},
		{"Inspect", testInspect},
		{"Watch", testWatch},
		{"QueueOrder", testQueueOrder},
		{"QueueShared", testQueueShared},
		{"QueueSemaphore", testQueueSemaphore},
		{"ConcurrentSemaphore", testConcurrentSemaphore},
		{"QueueWakesTheHead", testQueueWakesTheHead},
		{"QueueTicketExpires", testQueueTicketExpires},
		{"QueueTicketLife", testQueueTicketLife},
		{"ConcurrentAcquire", testConcurrentAcquire},
		{"CanceledContext", testCanceledContext},
		{"Closed", testClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, open(t)) })
	}
}

// RunExhausted checks what a backend answers once a name has no fencing
// token left below backend.MaxToken. open returns a fresh backend, as for
// Run, and a function that uses up the tokens of a name (on some
// backends, of every name): the next token it would grant is MaxToken or
// more. A grant then fails with ErrTokensExhausted and writes nothing;
// what needs no new token (a held name denied, a repeated grant, a
// renewal, a release) answers as ever.
func RunExhausted(t *testing.T, open func(t *testing.T) (b backend.Backend, exhaust func(name string))) {
	b, exhaust := open(t)
	ctx := t.Context()
	held := map[backend.Mode]backend.AcquireRequest{
		backend.Exclusive: request("exhausted/x", "a", backend.Exclusive),
		backend.Shared:    request("exhausted/s", "a", backend.Shared),
	}
	tokens := map[backend.Mode]uint64{}
	for mode, req := range held {
		tokens[mode] = mustAcquire(t, b, req)
	}
	for _, req := range held {
		exhaust(req.Name)
	}
	exhaust("exhausted/free")

	for _, mode := range []backend.Mode{backend.Exclusive, backend.Shared} {
		for _, ticket := range []string{"", "t-" + mode.String()} {
			req := request("exhausted/free", "b-"+mode.String()+ticket, mode)
			req.Ticket = ticket
			_, err := b.Acquire(ctx, req)
			require.ErrorIs(t, err, backend.ErrTokensExhausted, "%v acquire, ticket %q", mode, ticket)
			require.NotErrorIs(t, err, backend.ErrHeld)
			require.NotErrorIs(t, err, backend.ErrForeignKey)
			require.Empty(t, mustInspect(t, b, req.Name).Holders, "nothing was granted")
			require.NoError(t, b.Leave(ctx, req.Name, ticket))
		}

		req := held[mode]
		require.Equal(t, tokens[mode], mustAcquire(t, b, req), "%v: a repeated grant", mode)
		mustDeny(t, b, request(req.Name, "c", backend.Exclusive))
		for _, err := range b.Renew(ctx, []backend.RenewRequest{{LeaseKey: lease(req), TTL: ttl}}) {
			require.NoError(t, err, "%v renewal", mode)
		}
		mustRelease(t, b, lease(req))
		_, err := b.Acquire(ctx, request(req.Name, "d", mode))
		require.ErrorIs(t, err, backend.ErrTokensExhausted, "%v acquire once released", mode)
		require.Empty(t, mustInspect(t, b, req.Name).Holders)
	}
}

// request is an acquire of name by lease for ttl.
func request(name, lease string, mode backend.Mode) backend.AcquireRequest {
	return backend.AcquireRequest{Name: name, LeaseID: lease, Mode: mode, TTL: ttl}
}

// lease is the lease that req asks for.
func lease(req backend.AcquireRequest) backend.LeaseKey {
	return backend.LeaseKey{Name: req.Name, LeaseID: req.LeaseID, Mode: req.Mode}
}

// mustAcquire requires req to be granted and returns a valid token.
func mustAcquire(t *testing.T, b backend.Backend, req backend.AcquireRequest) uint64 {
	t.Helper()
	g, err := b.Acquire(t.Context(), req)
	require.NoError(t, err, "acquire %s by %s", req.Name, req.LeaseID)
	require.Positive(t, g.Token, "token")
	require.Less(t, g.Token, uint64(backend.MaxToken), "token")
	return g.Token
}

// mustDeny requires req to be denied with a HeldError and returns its
// RetryIn, which must be positive.
func mustDeny(t *testing.T, b backend.Backend, req backend.AcquireRequest) time.Duration {
	t.Helper()
	_, err := b.Acquire(t.Context(), req)
	var held *backend.HeldError
	require.ErrorAs(t, err, &held, "acquire %s by %s", req.Name, req.LeaseID)
	require.ErrorIs(t, err, backend.ErrHeld)
	require.Positive(t, held.RetryIn, "RetryIn")
	return held.RetryIn
}

func mustRelease(t *testing.T, b backend.Backend, l backend.LeaseKey) {
	t.Helper()
	require.NoError(t, b.Release(t.Context(), l), "release %s by %s", l.Name, l.LeaseID)
}

func mustInspect(t *testing.T, b backend.Backend, name string) backend.LockInfo {
	t.Helper()
	info, err := b.Inspect(t.Context(), name)
	require.NoError(t, err, "inspect %s", name)
	return info
}

// requireHolders requires the live holders of name to be exactly these
// lease ids with these tokens.
func requireHolders(t *testing.T, b backend.Backend, name string, want map[string]uint64) {
	t.Helper()
	got := map[string]uint64{}
	for _, h := range mustInspect(t, b, name).Holders {
		got[h.LeaseID] = h.Token
	}
	require.Equal(t, want, got, "holders of %s", name)
}

// waitFree polls until name has no live holder.
func waitFree(t *testing.T, b backend.Backend, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		info, err := b.Inspect(t.Context(), name)
		return assert.NoError(t, err) && len(info.Holders) == 0
	}, waitFor, tick, "%s never became free", name)
}

// expireSoon acquires req with shortTTL. It returns the time before the
// acquire was sent, and a function that waits until the lease has expired
// without touching its name (a backend may prune a name whenever it is
// touched): it polls a probe lease on another name, granted just after req
// with the same TTL, which cannot expire before req does.
func expireSoon(t *testing.T, b backend.Backend, req backend.AcquireRequest) (time.Time, func()) {
	t.Helper()
	req.TTL = shortTTL
	probe := request(req.Name+"/probe", "probe", backend.Exclusive)
	probe.TTL = shortTTL
	sent := time.Now()
	mustAcquire(t, b, req)
	mustAcquire(t, b, probe)
	return sent, func() {
		t.Helper()
		waitFree(t, b, probe.Name)
	}
}

// requireNotified waits for a notification on ch.
func requireNotified(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		require.FailNow(t, msg)
	}
}

// requireQuiet requires ch to receive nothing for a while: a backend may
// deliver notifications asynchronously.
func requireQuiet(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	select {
	case <-ch:
		require.FailNow(t, msg)
	case <-timer.C:
	}
}

func testConflicts(t *testing.T, b backend.Backend) {
	x, s := backend.Exclusive, backend.Shared
	for _, tt := range []struct {
		first, second backend.Mode
		granted       bool
	}{
		{x, x, false},
		{x, s, false},
		{s, x, false},
		{s, s, true},
	} {
		name := "conflict/" + tt.first.String() + "/" + tt.second.String()
		t.Run(tt.first.String()+"/"+tt.second.String(), func(t *testing.T) {
			a := request(name, "a", tt.first)
			c := request(name, "c", tt.second)
			ta := mustAcquire(t, b, a)
			if tt.granted {
				tc := mustAcquire(t, b, c)
				require.NotEqual(t, ta, tc)
				requireHolders(t, b, name, map[string]uint64{"a": ta, "c": tc})
				return
			}
			require.LessOrEqual(t, mustDeny(t, b, c), ttl, "RetryIn")
			requireHolders(t, b, name, map[string]uint64{"a": ta})
			mustRelease(t, b, lease(a))
			tc := mustAcquire(t, b, c)
			requireHolders(t, b, name, map[string]uint64{"c": tc})
		})
	}
}

func testSemaphore(t *testing.T, b backend.Backend) {
	const name, limit = "sem", 3
	slot := func(id string) backend.AcquireRequest {
		req := request(name, id, backend.Shared)
		req.Limit = limit
		return req
	}
	held := map[string]uint64{}
	for _, id := range []string{"s1", "s2", "s3"} {
		held[id] = mustAcquire(t, b, slot(id))
	}
	require.LessOrEqual(t, mustDeny(t, b, slot("s4")), ttl, "RetryIn")
	requireHolders(t, b, name, held)

	// The acquiring request's limit decides: without one, no bound.
	unlimited := request(name, "u", backend.Shared)
	mustAcquire(t, b, unlimited)
	mustRelease(t, b, lease(unlimited))

	// An exclusive request stays out however many slots are free.
	mustDeny(t, b, request(name, "x", backend.Exclusive))

	// A release frees a slot.
	mustRelease(t, b, lease(slot("s2")))
	delete(held, "s2")
	held["s4"] = mustAcquire(t, b, slot("s4"))
	requireHolders(t, b, name, held)
	mustDeny(t, b, slot("s5"))
}

func testRetryIn(t *testing.T, b backend.Backend) {
	// An exclusive holder: retry when it expires.
	mustAcquire(t, b, request("retry/x", "a", backend.Exclusive))
	for _, mode := range []backend.Mode{backend.Exclusive, backend.Shared} {
		d := mustDeny(t, b, request("retry/x", "c", mode))
		require.LessOrEqual(t, d, ttl, "RetryIn behind an exclusive holder, %v", mode)
		require.Greater(t, d, ttl/2, "RetryIn behind an exclusive holder, %v", mode)
	}

	// Shared holders expiring at ttl and 2*ttl: an exclusive request waits
	// for the last of them, a full semaphore for the first.
	short := request("retry/s", "s1", backend.Shared)
	long := request("retry/s", "s2", backend.Shared)
	long.TTL = 2 * ttl
	mustAcquire(t, b, short)
	mustAcquire(t, b, long)
	d := mustDeny(t, b, request("retry/s", "x", backend.Exclusive))
	require.Greater(t, d, ttl, "RetryIn of an exclusive request behind shared holders")
	require.LessOrEqual(t, d, 2*ttl, "RetryIn of an exclusive request behind shared holders")
	full := request("retry/s", "s3", backend.Shared)
	full.Limit = 2
	d = mustDeny(t, b, full)
	require.Greater(t, d, ttl/2, "RetryIn of a full semaphore")
	require.LessOrEqual(t, d, ttl, "RetryIn of a full semaphore")
}

func testIdempotentAcquire(t *testing.T, b backend.Backend) {
	for _, mode := range []backend.Mode{backend.Exclusive, backend.Shared} {
		t.Run(mode.String(), func(t *testing.T) {
			name := "idem/" + mode.String()
			req := request(name, "a", mode)
			req.Limit = 1 // a full semaphore does not deny its own holder
			tok := mustAcquire(t, b, req)

			// Repeating the request, with a longer TTL, extends the same grant.
			again := req
			again.TTL = 3 * ttl
			require.Equal(t, tok, mustAcquire(t, b, again), "token of a repeated acquire")
			info := mustInspect(t, b, name)
			require.Len(t, info.Holders, 1)
			require.Equal(t, tok, info.Holders[0].Token)
			require.Greater(t, info.Holders[0].ExpiresIn, ttl, "expiry of a repeated acquire")
			require.Equal(t, tok, info.LastToken, "a repeated acquire is not a new grant")

			mustRelease(t, b, lease(req))
			require.Greater(t, mustAcquire(t, b, request(name, "c", mode)), tok, "the next grant")
		})
	}
}

// testInvalidRequest: a request that breaks the contract is refused as
// such, and changes nothing.
func testInvalidRequest(t *testing.T, b backend.Backend) {
	limited := request("bad/n", "a", backend.Shared)
	limited.Limit = -1
	for what, req := range map[string]backend.AcquireRequest{
		"no name":                request("", "a", backend.Exclusive),
		"no lease id":            request("bad/n", "", backend.Exclusive),
		"a mode of neither kind": request("bad/n", "a", backend.Mode(7)),
		"no ttl":                 {Name: "bad/n", LeaseID: "a", Mode: backend.Exclusive},
		"a negative limit":       limited,
		"a release of another name": {Name: "bad/n", LeaseID: "a", Mode: backend.Exclusive, TTL: ttl,
			Releases: []backend.LeaseKey{{Name: "bad/m", LeaseID: "b", Mode: backend.Exclusive}}},
	} {
		_, err := b.Acquire(t.Context(), req)
		require.ErrorIs(t, err, backend.ErrInvalidRequest, what)
	}
	info := mustInspect(t, b, "bad/n")
	require.Empty(t, info.Holders)
	require.Zero(t, info.LastToken)
}

// testReleasesFirst: an acquire's Releases are released before it, in
// whatever mode; one that holds nothing (released already) is passed
// over; waiters woken by them are woken.
func testReleasesFirst(t *testing.T, b backend.Backend) {
	x1 := request("rf/x", "x1", backend.Exclusive)
	mustAcquire(t, b, x1)
	x2 := request("rf/x", "x2", backend.Exclusive)
	x2.Releases = []backend.LeaseKey{lease(x1)}
	t2 := mustAcquire(t, b, x2)
	requireHolders(t, b, "rf/x", map[string]uint64{"x2": t2})

	// Passed over: x1 holds nothing now; and shared holders let go for an
	// exclusive one.
	x3 := request("rf/x", "x3", backend.Exclusive)
	x3.Releases = []backend.LeaseKey{lease(x1), lease(x2)}
	t3 := mustAcquire(t, b, x3)
	require.Greater(t, t3, t2)
	requireHolders(t, b, "rf/x", map[string]uint64{"x3": t3})

	s1, s2 := request("rf/s", "s1", backend.Shared), request("rf/s", "s2", backend.Shared)
	mustAcquire(t, b, s1)
	mustAcquire(t, b, s2)
	x := request("rf/s", "x", backend.Exclusive)
	mustDeny(t, b, x)
	x.Releases = []backend.LeaseKey{lease(s1), lease(s2)}
	tx := mustAcquire(t, b, x)
	requireHolders(t, b, "rf/s", map[string]uint64{"x": tx})

	// A release sent again later holds nothing.
	require.ErrorIs(t, b.Release(t.Context(), lease(s1)), backend.ErrNotHeld)
	requireHolders(t, b, "rf/s", map[string]uint64{"x": tx})
}

func testLeaseIDInOtherMode(t *testing.T, b backend.Backend) {
	for _, mode := range []backend.Mode{backend.Exclusive, backend.Shared} {
		t.Run(mode.String(), func(t *testing.T) {
			name := "other/" + mode.String()
			req := request(name, "a", mode)
			tok := mustAcquire(t, b, req)
			other := request(name, "a", backend.Shared)
			if mode == backend.Shared {
				other.Mode = backend.Exclusive
			}
			_, err := b.Acquire(t.Context(), other)
			require.ErrorIs(t, err, backend.ErrOtherMode, "acquire by a lease id that holds the name in the other mode")
			info := mustInspect(t, b, name)
			require.Len(t, info.Holders, 1)
			require.Equal(t, mode, info.Holders[0].Mode)
			require.Equal(t, tok, info.Holders[0].Token)
			require.Equal(t, tok, info.LastToken)
			mustRelease(t, b, lease(req))
		})
	}
}

func testTokensIncrease(t *testing.T, b backend.Backend) {
	last := map[string]uint64{}
	next := func(name, id string, mode backend.Mode) backend.LeaseKey {
		tok := mustAcquire(t, b, request(name, id, mode))
		require.Greater(t, tok, last[name], "token of %s after %d", name, last[name])
		last[name] = tok
		return backend.LeaseKey{Name: name, LeaseID: id, Mode: mode}
	}
	for i := range 20 {
		for _, name := range []string{"tok/a", "tok/b"} {
			if i%2 == 0 {
				mustRelease(t, b, next(name, "x", backend.Exclusive))
			} else {
				l1 := next(name, "s1", backend.Shared)
				l2 := next(name, "s2", backend.Shared)
				mustRelease(t, b, l1)
				l3 := next(name, "s3", backend.Shared)
				mustRelease(t, b, l2)
				mustRelease(t, b, l3)
			}
			require.Equal(t, last[name], mustInspect(t, b, name).LastToken, "last token of %s", name)
		}
	}
}

func testReleaseNotHeld(t *testing.T, b backend.Backend) {
	for _, mode := range []backend.Mode{backend.Exclusive, backend.Shared} {
		t.Run(mode.String(), func(t *testing.T) {
			name := "rel/" + mode.String()
			a := request(name, "a", mode)
			ta := mustAcquire(t, b, a)
			other := backend.Shared
			if mode == backend.Shared {
				other = backend.Exclusive
			}
			for _, l := range []backend.LeaseKey{
				{Name: name, LeaseID: "nobody", Mode: mode}, // a non-owner
				{Name: name, LeaseID: "a", Mode: other},     // the owner, in the wrong mode
				{Name: "rel/never", LeaseID: "a", Mode: mode},
			} {
				require.ErrorIs(t, b.Release(t.Context(), l), backend.ErrNotHeld, "release %+v", l)
			}
			requireHolders(t, b, name, map[string]uint64{"a": ta})

			mustRelease(t, b, lease(a))
			c := request(name, "c", mode)
			tc := mustAcquire(t, b, c)
			require.ErrorIs(t, b.Release(t.Context(), lease(a)), backend.ErrNotHeld, "double release")
			requireHolders(t, b, name, map[string]uint64{"c": tc})
		})
	}
}

func testRenewBatch(t *testing.T, b backend.Backend) {
	good1 := request("ren/a", "a", backend.Exclusive)
	mustAcquire(t, b, good1)
	released := request("ren/b", "b", backend.Exclusive)
	mustAcquire(t, b, released)
	mustRelease(t, b, lease(released))
	good2 := request("ren/d", "d", backend.Shared)
	mustAcquire(t, b, good2)
	// An expired shared lease beside a live one, which keeps the name held.
	alive := request("ren/c", "c2", backend.Shared)
	tAlive := mustAcquire(t, b, alive)
	expired := request("ren/c", "c", backend.Shared)
	_, wait := expireSoon(t, b, expired)
	wait()

	batch := []struct {
		backend.LeaseKey
		ttl     time.Duration
		renewed bool
	}{
		{lease(good1), 2 * ttl, true},
		{backend.LeaseKey{Name: "ren/a", LeaseID: "nobody", Mode: backend.Exclusive}, time.Hour, false}, // foreign
		{lease(released), ttl, false},
		{lease(good2), 2 * ttl, true},
		{lease(expired), ttl, false},
		{backend.LeaseKey{Name: "ren/d", LeaseID: "d", Mode: backend.Exclusive}, time.Hour, false}, // wrong mode
		{backend.LeaseKey{Name: "ren/never", LeaseID: "a", Mode: backend.Exclusive}, ttl, false},
	}
	reqs := make([]backend.RenewRequest, len(batch))
	for i, r := range batch {
		reqs[i] = backend.RenewRequest{LeaseKey: r.LeaseKey, TTL: r.ttl}
	}
	errs := b.Renew(t.Context(), reqs)
	require.Len(t, errs, len(reqs))
	for i, r := range batch {
		if r.renewed {
			require.NoError(t, errs[i], "renew %d: %+v", i, r.LeaseKey)
		} else {
			require.ErrorIs(t, errs[i], backend.ErrNotHeld, "renew %d: %+v", i, r.LeaseKey)
		}
	}
	require.Empty(t, b.Renew(t.Context(), nil))

	// The good leases were extended by their new TTL; the foreign and
	// wrong-mode renewals (an hour) extended nothing.
	for _, name := range []string{"ren/a", "ren/d"} {
		info := mustInspect(t, b, name)
		require.Len(t, info.Holders, 1, "holders of %s", name)
		require.Greater(t, info.Holders[0].ExpiresIn, ttl, "expiry of %s", name)
		require.LessOrEqual(t, info.Holders[0].ExpiresIn, 2*ttl, "expiry of %s", name)
	}
	// The expired lease was not resurrected.
	requireHolders(t, b, "ren/c", map[string]uint64{"c2": tAlive})
	errs = b.Renew(t.Context(), []backend.RenewRequest{{LeaseKey: lease(expired), TTL: ttl}})
	require.ErrorIs(t, errs[0], backend.ErrNotHeld, "renew after a failed renew")
}

func testExpiryFreesName(t *testing.T, b backend.Backend) {
	for _, mode := range []backend.Mode{backend.Exclusive, backend.Shared} {
		t.Run(mode.String(), func(t *testing.T) {
			name := "exp/" + mode.String()
			a := request(name, "a", mode)
			sent, wait := expireSoon(t, b, a)
			wait()
			// The backend applied the grants after sent, so they lasted until
			// sent+shortTTL at least (1% and 2ms allowed for the clock of a
			// backend in another process), and not much longer (the slack
			// is for a loaded machine).
			took := time.Since(sent)
			require.GreaterOrEqual(t, took, shortTTL-shortTTL/100-2*time.Millisecond, "a lease expired before its TTL")
			require.Less(t, took, shortTTL+2*time.Second, "a lease outlived its TTL")

			// Neither a release nor a renewal brings an expired lease back.
			require.ErrorIs(t, b.Release(t.Context(), lease(a)), backend.ErrNotHeld, "release after expiry")
			errs := b.Renew(t.Context(), []backend.RenewRequest{{LeaseKey: lease(a), TTL: ttl}})
			require.ErrorIs(t, errs[0], backend.ErrNotHeld, "renew after expiry")
			require.Empty(t, mustInspect(t, b, name).Holders)

			c := request(name, "c", backend.Exclusive)
			tc := mustAcquire(t, b, c)
			require.ErrorIs(t, b.Release(t.Context(), lease(a)), backend.ErrNotHeld, "release after takeover")
			errs = b.Renew(t.Context(), []backend.RenewRequest{{LeaseKey: lease(a), TTL: ttl}})
			require.ErrorIs(t, errs[0], backend.ErrNotHeld, "renew after takeover")
			requireHolders(t, b, name, map[string]uint64{"c": tc})
		})
	}
}

func testRenewKeepsAlive(t *testing.T, b backend.Backend) {
	const name = "alive"
	a := request(name, "a", backend.Exclusive)
	_, wait := expireSoon(t, b, a)
	errs := b.Renew(t.Context(), []backend.RenewRequest{{LeaseKey: lease(a), TTL: ttl}})
	require.NoError(t, errs[0], "renew")
	wait()

	// Past its first TTL, the lease lives on, with its renewed TTL.
	info := mustInspect(t, b, name)
	require.Len(t, info.Holders, 1)
	require.Equal(t, "a", info.Holders[0].LeaseID)
	require.Greater(t, info.Holders[0].ExpiresIn, ttl/2)
	mustDeny(t, b, request(name, "c", backend.Exclusive))
	errs = b.Renew(t.Context(), []backend.RenewRequest{{LeaseKey: lease(a), TTL: ttl}})
	require.NoError(t, errs[0], "renew")
	mustRelease(t, b, lease(a))
}

// testRenewTakenOver: a renewal of a lease that expired says whether a
// conflicting lease holds the name now.
func testRenewTakenOver(t *testing.T, b backend.Backend) {
	for _, tc := range []struct {
		name       string
		old, taker backend.Mode
		takenOver  bool
	}{
		{"exclusive by exclusive", backend.Exclusive, backend.Exclusive, true},
		{"exclusive by shared", backend.Exclusive, backend.Shared, true},
		{"shared by exclusive", backend.Shared, backend.Exclusive, true},
		{"shared beside shared", backend.Shared, backend.Shared, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "taken/" + strings.ReplaceAll(tc.name, " ", "-")
			old := request(name, "old", tc.old)
			_, wait := expireSoon(t, b, old)
			wait()
			mustAcquire(t, b, request(name, "taker", tc.taker))
			err := b.Renew(t.Context(), []backend.RenewRequest{{LeaseKey: lease(old), TTL: ttl}})[0]
			require.ErrorIs(t, err, backend.ErrNotHeld)
			assert.Equal(t, tc.takenOver, errors.Is(err, backend.ErrTakenOver), "%v", err)
			requireHolders(t, b, name, map[string]uint64{"taker": mustInspect(t, b, name).Holders[0].Token})
		})
	}
}

func testInspect(t *testing.T, b backend.Backend) {
	never := mustInspect(t, b, "insp/never")
	require.Empty(t, never.Holders)
	require.Zero(t, never.LastToken)

	x := request("insp/x", "a", backend.Exclusive)
	x.Meta, x.Host = "job 1", "host-a"
	tx := mustAcquire(t, b, x)
	info := mustInspect(t, b, "insp/x")
	require.Len(t, info.Holders, 1)
	h := info.Holders[0]
	require.Equal(t, backend.Holder{LeaseID: "a", Mode: backend.Exclusive, Token: tx, Meta: "job 1", Host: "host-a", ExpiresIn: h.ExpiresIn}, h)
	require.Greater(t, h.ExpiresIn, ttl/2)
	require.LessOrEqual(t, h.ExpiresIn, ttl)
	require.Equal(t, tx, info.LastToken)

	mustRelease(t, b, lease(x))
	info = mustInspect(t, b, "insp/x")
	require.Empty(t, info.Holders)
	require.Equal(t, tx, info.LastToken, "last token after release")

	s1 := request("insp/s", "s1", backend.Shared)
	s1.Meta, s1.Host = "reader 1", "host-a"
	s2 := request("insp/s", "s2", backend.Shared)
	s2.Meta, s2.Host, s2.TTL = "reader 2", "host-b", 2*ttl
	t1 := mustAcquire(t, b, s1)
	t2 := mustAcquire(t, b, s2)
	info = mustInspect(t, b, "insp/s")
	require.Len(t, info.Holders, 2)
	slices.SortFunc(info.Holders, func(p, q backend.Holder) int { return cmp.Compare(p.Token, q.Token) })
	require.Equal(t, backend.Holder{LeaseID: "s1", Mode: backend.Shared, Token: t1, Meta: "reader 1", Host: "host-a", ExpiresIn: info.Holders[0].ExpiresIn}, info.Holders[0])
	require.Equal(t, backend.Holder{LeaseID: "s2", Mode: backend.Shared, Token: t2, Meta: "reader 2", Host: "host-b", ExpiresIn: info.Holders[1].ExpiresIn}, info.Holders[1])
	require.LessOrEqual(t, info.Holders[0].ExpiresIn, ttl)
	require.Greater(t, info.Holders[1].ExpiresIn, ttl)
	require.Equal(t, t2, info.LastToken)
}

func testWatch(t *testing.T, b backend.Backend) {
	const name = "watch"
	ch1, cancel1, err := b.Watch(t.Context(), name, "")
	require.NoError(t, err)
	defer cancel1()
	ch2, cancel2, err := b.Watch(t.Context(), name, "")
	require.NoError(t, err)
	defer cancel2()
	other, cancelOther, err := b.Watch(t.Context(), "watch/other", "")
	require.NoError(t, err)
	defer cancelOther()

	a := request(name, "a", backend.Exclusive)
	mustAcquire(t, b, a)
	mustDeny(t, b, request(name, "c", backend.Exclusive))
	requireQuiet(t, ch1, "notified before the release")

	mustRelease(t, b, lease(a))
	requireNotified(t, ch1, "first watcher not notified of the release")
	requireNotified(t, ch2, "second watcher not notified of the release")
	require.Empty(t, other, "watcher of another name notified")

	cancel1()
	cancel1() // idempotent
	mustAcquire(t, b, a)
	mustRelease(t, b, lease(a))
	requireNotified(t, ch2, "remaining watcher not notified")
	requireQuiet(t, ch1, "notified after cancel")
}

func testConcurrentAcquire(t *testing.T, b backend.Backend) {
	const goroutines = 32

	// One race for a free name: exactly one winner.
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		won    atomic.Int32
		winner atomic.Value
	)
	for i := range goroutines {
		wg.Go(func() {
			id := fmt.Sprintf("g%d", i)
			<-start
			_, err := b.Acquire(t.Context(), request("race", id, backend.Exclusive))
			if err == nil {
				won.Add(1)
				winner.Store(id)
				return
			}
			var held *backend.HeldError
			assert.ErrorAs(t, err, &held)
		})
	}
	close(start)
	wg.Wait()
	require.EqualValues(t, 1, won.Load(), "winners")
	info := mustInspect(t, b, "race")
	require.Len(t, info.Holders, 1)
	require.Equal(t, winner.Load(), info.Holders[0].LeaseID)

	// Many rounds: never two holders at once, and the tokens, logged inside
	// the critical section, increase in the order of the grants.
	var (
		inside atomic.Int32
		mu     sync.Mutex
		tokens []uint64
	)
	for i := range goroutines / 4 {
		wg.Go(func() {
			for j := range 50 {
				req := request("rounds", fmt.Sprintf("g%d-%d", i, j), backend.Exclusive)
				g, err := b.Acquire(t.Context(), req)
				if err != nil {
					var held *backend.HeldError
					assert.ErrorAs(t, err, &held)
					continue
				}
				assert.EqualValues(t, 1, inside.Add(1), "holders at once")
				mu.Lock()
				tokens = append(tokens, g.Token)
				mu.Unlock()
				inside.Add(-1)
				assert.NoError(t, b.Release(t.Context(), lease(req)))
			}
		})
	}
	wg.Wait()
	require.NotEmpty(t, tokens)
	for i := 1; i < len(tokens); i++ {
		require.Greater(t, tokens[i], tokens[i-1], "token %d of %d", i, len(tokens))
	}
}

// testConcurrentSemaphore: waiters and tries racing for a shared name
// under a limit are never more than the limit at once, and every waiter,
// asking again as an agent's would, is granted.
func testConcurrentSemaphore(t *testing.T, b backend.Backend) {
	const (
		name    = "semaphore/race"
		limit   = 3
		workers = 8
		rounds  = 15
	)
	var (
		wg     sync.WaitGroup
		inside atomic.Int32
		most   atomic.Int32
	)
	hold := func(req backend.AcquireRequest) {
		n := inside.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		assert.LessOrEqual(t, n, int32(limit), "holders at once")
		// Held while others ask, until the limit has been reached once
		// (or for 50ms): the overlap the limit allows is seen however
		// long a backend's grants take, a consensus store's included.
		for end := time.Now().Add(50 * time.Millisecond); most.Load() < limit && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		inside.Add(-1)
		assert.NoError(t, b.Release(t.Context(), lease(req)))
	}
	for i := range workers {
		wg.Go(func() {
			for j := range rounds {
				req := request(name, fmt.Sprintf("w%d-%d", i, j), backend.Shared)
				req.Limit = limit
				if i%4 == 3 {
					// A try: granted only when nobody queues.
					if _, err := b.Acquire(t.Context(), req); err == nil {
						hold(req)
					}
					continue
				}
				req.Ticket = "q-" + req.LeaseID
				deadline := time.Now().Add(20 * time.Second)
				for {
					_, err := b.Acquire(t.Context(), req)
					if err == nil {
						hold(req)
						break
					}
					if !assert.ErrorIs(t, err, backend.ErrHeld) || !assert.True(t, time.Now().Before(deadline), "waiter %s never granted", req.LeaseID) {
						return
					}
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, most.Load(), int32(limit))
	require.Equal(t, int32(limit), most.Load(), "the limit was reached: the waiters overlapped")
	requireQueued(t, b, name, 0)
}

func testCanceledContext(t *testing.T, b backend.Backend) {
	a := request("ctx", "a", backend.Exclusive)
	mustAcquire(t, b, a)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	_, err := b.Acquire(ctx, request("ctx/b", "b", backend.Exclusive))
	require.ErrorIs(t, err, context.Canceled, "acquire")
	errs := b.Renew(ctx, []backend.RenewRequest{{LeaseKey: lease(a), TTL: ttl}, {LeaseKey: lease(a), TTL: ttl}})
	require.Len(t, errs, 2)
	for _, err := range errs {
		require.ErrorIs(t, err, context.Canceled, "renew")
	}
	require.ErrorIs(t, b.Release(ctx, lease(a)), context.Canceled, "release")
	_, err = b.Inspect(ctx, "ctx")
	require.ErrorIs(t, err, context.Canceled, "inspect")
	_, _, err = b.Watch(ctx, "ctx", "")
	require.ErrorIs(t, err, context.Canceled, "watch")
}

func testClosed(t *testing.T, b backend.Backend) {
	a := request("closed", "a", backend.Exclusive)
	mustAcquire(t, b, a)
	require.NoError(t, b.Close())

	_, err := b.Acquire(t.Context(), request("closed/b", "b", backend.Exclusive))
	require.ErrorIs(t, err, backend.ErrClosed, "acquire")
	errs := b.Renew(t.Context(), []backend.RenewRequest{{LeaseKey: lease(a), TTL: ttl}})
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], backend.ErrClosed, "renew")
	require.ErrorIs(t, b.Release(t.Context(), lease(a)), backend.ErrClosed, "release")
	_, err = b.Inspect(t.Context(), "closed")
	require.ErrorIs(t, err, backend.ErrClosed, "inspect")
	_, _, err = b.Watch(t.Context(), "closed", "")
	require.ErrorIs(t, err, backend.ErrClosed, "watch")
}

// waiter is a waiting acquire's request: its lease id and its ticket.
func waiter(name, id string, mode backend.Mode) backend.AcquireRequest {
	req := request(name, id, mode)
	req.Ticket = "q-" + id
	return req
}

func requireQueued(t *testing.T, b backend.Backend, name string, n int) {
	t.Helper()
	require.Equal(t, n, mustInspect(t, b, name).Queued, "tickets queued for %s", name)
}

// testQueueOrder: waiters are granted in the order they first asked;
// neither a later waiter nor a try jumps ahead, even when the name is
// free.
func testQueueOrder(t *testing.T, b backend.Backend) {
	const name = "queue"
	h := request(name, "h", backend.Exclusive)
	mustAcquire(t, b, h)
	w1, w2, w3 := waiter(name, "w1", backend.Exclusive), waiter(name, "w2", backend.Exclusive), waiter(name, "w3", backend.Exclusive)
	for _, w := range []backend.AcquireRequest{w1, w2, w3} {
		mustDeny(t, b, w)
	}
	mustDeny(t, b, w2) // asking again keeps its place
	requireQueued(t, b, name, 3)
	mustRelease(t, b, lease(h))

	mustDeny(t, b, request(name, "try", backend.Exclusive))
	mustDeny(t, b, request(name, "try", backend.Shared))
	mustDeny(t, b, w3)
	mustDeny(t, b, w2)
	t1 := mustAcquire(t, b, w1)
	requireQueued(t, b, name, 2)
	mustRelease(t, b, lease(w1))
	mustDeny(t, b, w3)
	t2 := mustAcquire(t, b, w2)
	mustRelease(t, b, lease(w2))
	t3 := mustAcquire(t, b, w3)
	require.Less(t, t1, t2)
	require.Less(t, t2, t3)
	requireQueued(t, b, name, 0)
	mustRelease(t, b, lease(w3))
	mustAcquire(t, b, request(name, "try", backend.Exclusive)) // nobody queues now
}

// testQueueShared: shared waiters at the head are granted together; once
// an exclusive waiter queues, later shared ones wait behind it even while
// the lock is held shared.
func testQueueShared(t *testing.T, b backend.Backend) {
	const name = "queue/shared"
	r0 := request(name, "r0", backend.Shared)
	mustAcquire(t, b, r0)
	x := waiter(name, "x", backend.Exclusive)
	mustDeny(t, b, x)
	s1, s2 := waiter(name, "s1", backend.Shared), waiter(name, "s2", backend.Shared)
	mustDeny(t, b, s1) // it could share with r0, but x waits ahead of it
	mustDeny(t, b, s2)
	mustRelease(t, b, lease(r0))
	mustAcquire(t, b, x)
	mustDeny(t, b, s1)
	mustRelease(t, b, lease(x))
	mustAcquire(t, b, s2) // the head is shared: both may go, in any order
	mustAcquire(t, b, s1)
	requireQueued(t, b, name, 0)

	// Shared waiters behind an exclusive one do not go with the head.
	x2 := waiter(name, "x2", backend.Exclusive)
	s3 := waiter(name, "s3", backend.Shared)
	mustDeny(t, b, x2)
	mustDeny(t, b, s3)
	mustRelease(t, b, lease(s1))
	mustRelease(t, b, lease(s2))
	mustDeny(t, b, s3)
	mustAcquire(t, b, x2)
}

// testQueueSemaphore: under a limit, the places that free up go to the
// shared waiters at the head in the order they queued, whichever asks
// first.
func testQueueSemaphore(t *testing.T, b backend.Backend) {
	const name = "queue/semaphore"
	limited := func(req backend.AcquireRequest) backend.AcquireRequest {
		req.Limit = 2
		return req
	}
	h1, h2 := limited(request(name, "h1", backend.Shared)), limited(request(name, "h2", backend.Shared))
	mustAcquire(t, b, h1)
	mustAcquire(t, b, h2)
	var ws []backend.AcquireRequest
	for _, id := range []string{"w1", "w2", "w3", "w4"} {
		w := limited(waiter(name, id, backend.Shared))
		mustDeny(t, b, w)
		ws = append(ws, w)
	}
	requireQueued(t, b, name, 4)

	// One place frees: it is w1's, not the first to ask's.
	mustRelease(t, b, lease(h1))
	retry := mustDeny(t, b, ws[3])
	require.LessOrEqual(t, retry, ttl, "RetryIn: at most until the next holder expires")
	mustDeny(t, b, ws[1])
	mustAcquire(t, b, ws[0])
	mustDeny(t, b, ws[2])

	// Two places free: w2's and w3's; w4 waits for the next.
	mustRelease(t, b, lease(h2))
	mustRelease(t, b, lease(ws[0]))
	mustDeny(t, b, ws[3])
	mustAcquire(t, b, ws[2])
	mustDeny(t, b, ws[3])
	mustAcquire(t, b, ws[1])
	mustDeny(t, b, ws[3])
	requireQueued(t, b, name, 1)

	// A waiter that leaves gives its turn to the next.
	mustRelease(t, b, lease(ws[1]))
	w5 := limited(waiter(name, "w5", backend.Shared))
	mustDeny(t, b, w5)
	require.NoError(t, b.Leave(t.Context(), name, ws[3].Ticket))
	mustAcquire(t, b, w5)
	requireQueued(t, b, name, 0)
}

// testQueueWakesTheHead: a release wakes the waiter at the head, not the
// ones behind it; when the head leaves, the next one is woken.
func testQueueWakesTheHead(t *testing.T, b backend.Backend) {
	const name = "queue/wake"
	h := request(name, "h", backend.Exclusive)
	mustAcquire(t, b, h)
	w1, w2 := waiter(name, "w1", backend.Exclusive), waiter(name, "w2", backend.Exclusive)
	ch1, stop1, err := b.Watch(t.Context(), name, w1.Ticket)
	require.NoError(t, err)
	defer stop1()
	ch2, stop2, err := b.Watch(t.Context(), name, w2.Ticket)
	require.NoError(t, err)
	defer stop2()
	all, stopAll, err := b.Watch(t.Context(), name, "")
	require.NoError(t, err)
	defer stopAll()
	mustDeny(t, b, w1)
	mustDeny(t, b, w2)
	drain(ch1, ch2, all)

	mustRelease(t, b, lease(h))
	requireNotified(t, ch1, "the head not woken by the release")
	requireNotified(t, all, "a watch without a ticket not woken by the release")
	requireQuiet(t, ch2, "a waiter behind the head woken by the release")

	require.NoError(t, b.Leave(t.Context(), name, w1.Ticket))
	requireNotified(t, ch2, "the next waiter not woken when the head left")
	require.NoError(t, b.Leave(t.Context(), name, w1.Ticket), "leaving twice")
	require.NoError(t, b.Leave(t.Context(), "queue/none", "q-none"), "leaving a queue never joined")
	requireQueued(t, b, name, 1)
	mustAcquire(t, b, w2)
}

// drain empties notification channels.
func drain(chs ...<-chan struct{}) {
	for _, ch := range chs {
		select {
		case <-ch:
		default:
		}
	}
}

// testQueueTicketLife: a dead waiter's ticket of a long TTL leaves the
// queue after backend.TicketLife: a crashed agent's waiter does not hold
// up the name for its TTL.
func testQueueTicketLife(t *testing.T, b backend.Backend) {
	const name = "queue/life"
	h := request(name, "h", backend.Exclusive)
	mustAcquire(t, b, h)
	dead := waiter(name, "dead", backend.Exclusive)
	dead.TTL = time.Hour
	mustDeny(t, b, dead)
	start := time.Now()
	mustRelease(t, b, lease(h))
	live := waiter(name, "live", backend.Exclusive)
	require.Eventually(t, func() bool {
		_, err := b.Acquire(t.Context(), live)
		return err == nil
	}, backend.TicketLife+waitFor, tick, "the live waiter was never granted")
	elapsed := time.Since(start)
	require.GreaterOrEqual(t, elapsed, backend.TicketLife/2, "granted before the dead ticket expired")
	requireQueued(t, b, name, 0)
}

// testQueueTicketExpires: a waiter that stops asking (its agent died)
// leaves the queue when its ticket's TTL runs out, and the next waiter is
// granted.
func testQueueTicketExpires(t *testing.T, b backend.Backend) {
	const name = "queue/expiry"
	dead := waiter(name, "dead", backend.Exclusive)
	dead.TTL = shortTTL
	h := request(name, "h", backend.Exclusive)
	mustAcquire(t, b, h)
	mustDeny(t, b, dead)
	live := waiter(name, "live", backend.Exclusive)
	mustDeny(t, b, live)
	mustRelease(t, b, lease(h))
	start := time.Now()
	require.Eventually(t, func() bool {
		_, err := b.Acquire(t.Context(), live)
		return err == nil
	}, waitFor, tick, "the live waiter was never granted")
	require.GreaterOrEqual(t, time.Since(start), shortTTL/2, "granted before the dead ticket expired")
	requireQueued(t, b, name, 0)
}
