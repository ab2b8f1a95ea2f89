// Package backend defines the contract between the agent and the stores that
// hold locks: the Backend interface, its request and result types, and the
// sentinel errors every implementation returns.
//
// A backend knows names, lease ids, modes, tokens and TTLs. It knows nothing
// of sessions, sockets or the wire protocol: those belong to the agent and to
// socketapi. Implementations live in sub-packages (memory, redis), and
// backendtest is the conformance suite that every one of them passes.
package backend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Sentinel errors. Implementations wrap them with %w; callers match them with
// errors.Is.
var (
	// ErrHeld: the lock is held in a conflicting mode (or a semaphore is
	// full). Acquire returns it wrapped in a *HeldError.
	ErrHeld = errors.New("backend: held")
	// ErrNotHeld: the lease is not (or no longer) held by that lease id.
	ErrNotHeld = errors.New("backend: not held")
	// ErrTakenOver: the lease is gone and another lease holds the name
	// now. It wraps ErrNotHeld.
	ErrTakenOver = fmt.Errorf("%w: taken over", ErrNotHeld)
	// ErrOtherMode: Acquire by a lease id that holds the name in the other
	// mode. Lease ids are unique per grant, so this is a caller's bug:
	// neither a conflict worth waiting on (ErrHeld) nor a lease gone
	// (ErrNotHeld). Nothing changes.
	ErrOtherMode = errors.New("backend: lease id holds the name in the other mode")
	// ErrInvalidRequest: a request breaks the contract (see
	// AcquireRequest.Validate). Nothing changes.
	ErrInvalidRequest = errors.New("backend: invalid request")
	// ErrForeignKey: the lock's storage holds data this agent did not write.
	// It is never overwritten.
	ErrForeignKey = errors.New("backend: foreign key")
	// ErrTokensExhausted: no fencing token below MaxToken is left to
	// grant the name (on the memory backend, any name), or the store's
	// clock is too far ahead to give one. Nothing is granted until an
	// operator acts: tokens must never go back.
	ErrTokensExhausted = errors.New("backend: fencing tokens exhausted")
	// ErrUnavailable: the backend could not be reached or did not answer in
	// time. The outcome of the operation is unknown.
	ErrUnavailable = errors.New("backend: unavailable")
	// ErrClosed: the backend was closed.
	ErrClosed = errors.New("backend: closed")
)

// MaxToken is the bound below which every fencing token stays, so that every
// JSON library reads tokens exactly.
const MaxToken = 1<<53 - 1

// Mode is how a lease holds its name.
type Mode uint8

const (
	// Exclusive: one holder; denied by any live lease.
	Exclusive Mode = iota
	// Shared: any number of holders (or up to a limit); denied by a live
	// exclusive lease.
	Shared
)

// String returns the wire name of the mode.
func (m Mode) String() string {
	if m == Shared {
		return "shared"
	}
	return "exclusive"
}

// TicketLife bounds how long a waiter's ticket stays queued after its
// last attempt. A waiting acquire asks again at least every second, so a
// live waiter keeps its place; a dead one (its agent crashed) holds up the
// name's queue, and every try, this long at most, whatever its TTL.
const TicketLife = 5 * time.Second

// AcquireRequest is one attempt to take a name.
type AcquireRequest struct {
	Name    string
	LeaseID string // unique for every grant; identifies the owner
	Mode    Mode
	// Limit bounds the live shared holders when Mode is Shared and Limit > 0:
	// the grant is denied if Limit or more shared holders are live.
	Limit int
	TTL   time.Duration
	Meta  string // free text shown to inspect
	Host  string // the host of the holder, shown to inspect
	// Ticket, if set, is the waiter's place in the name's queue, the same
	// for every attempt of one waiting acquire. Waiters are served first
	// come, first served across every agent sharing the backend: a request
	// with a ticket is granted only when the ticket is at the head of the
	// queue, or shared with only shared tickets ahead of it (shared
	// waiters at the head are granted together), and the holders allow
	// it; otherwise the ticket joins the tail of the queue (or stays where
	// it is) and the request is denied. A ticket lives for TTL, and
	// TicketLife at most, from each attempt: a waiter that stops asking
	// (its agent died) leaves the queue then. A request without a ticket
	// (a try) is denied while any ticket is queued: it never jumps ahead
	// of waiters.
	Ticket string
	// Deadline, if set, is when the answer stops being of use (the grant
	// could no longer be handed out). A backend that waits on a network
	// waits no longer for the answer, and sends no retry of the request
	// after it, with one exception: a request that went out with others
	// in one round trip (Redis's group commit) may be sent again with
	// them later; Acquire then returns only once the last send is done,
	// so that what its caller does next (releasing a grant it may have
	// made) comes after.
	Deadline time.Time
	// Releases are leases of this agent on the name to release first, as
	// Release would, in the same round trip where the backend can: the
	// releases the agent answered and has not sent yet. One that does not
	// hold the name (it was released already) is passed over. When Acquire
	// fails with ErrUnavailable, a cancellation or ErrClosed, they may not
	// have been released; otherwise they were.
	Releases []LeaseKey
}

// Validate checks what every backend requires of an acquire: a name and
// a lease id, a mode, a positive TTL and a limit that is not negative (it
// counts in shared mode only). Every backend calls it first; a request it
// refuses gets ErrInvalidRequest.
func (r AcquireRequest) Validate() error {
	var why string
	switch {
	case r.Name == "":
		why = "no name"
	case r.LeaseID == "":
		why = "no lease id"
	case r.Mode != Exclusive && r.Mode != Shared:
		why = fmt.Sprintf("mode %d", r.Mode)
	case r.TTL <= 0:
		why = fmt.Sprintf("ttl %v is not positive", r.TTL)
	case r.Limit < 0:
		why = fmt.Sprintf("limit %d", r.Limit)
	case slices.ContainsFunc(r.Releases, func(l LeaseKey) bool { return l.Name != r.Name || l.LeaseID == r.LeaseID }):
		why = "a release of another name, or of the lease it asks for"
	default:
		return nil
	}
	return fmt.Errorf("%w: acquire %q: %s", ErrInvalidRequest, r.Name, why)
}

// Grant is a successful acquire.
type Grant struct {
	Token uint64 // fencing token: strictly increasing per name, < MaxToken
}

// HeldError is the error of a denied acquire. It wraps ErrHeld.
type HeldError struct {
	// RetryIn is how long until the lock would be free if nobody renewed:
	// a hint for when to try again without a notification.
	RetryIn time.Duration
}

func (e *HeldError) Error() string { return fmt.Sprintf("%v (retry in %v)", ErrHeld, e.RetryIn) }

// Unwrap lets errors.Is match ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

// LeaseKey identifies one grant, to renew or release: the name, the lease
// id that owns it, and its mode.
type LeaseKey struct {
	Name    string
	LeaseID string
	Mode    Mode
}

// RenewRequest extends one lease by TTL from the time the backend applies it.
type RenewRequest struct {
	LeaseKey
	TTL time.Duration
}

// Holder is one live lease on a name, as Inspect reports it.
type Holder struct {
	LeaseID   string
	Mode      Mode
	Token     uint64
	Meta      string
	Host      string
	ExpiresIn time.Duration // if nobody renews it
}

// LockInfo is the state of one name.
type LockInfo struct {
	Holders   []Holder // empty when the name is free
	LastToken uint64   // the last token granted for the name, 0 if unknown
	Queued    int      // live tickets in the name's queue
}

// Backend stores locks. Every method is safe for concurrent use.
type Backend interface {
	// Name is the backend's kind, as hello reports it ("memory", "redis").
	Name() string
	// Acquire makes one attempt. It returns a *HeldError when the lock is
	// taken. Acquire is idempotent for a lease id: repeating a granted
	// request returns the same token.
	Acquire(ctx context.Context, req AcquireRequest) (Grant, error)
	// Renew extends a batch of leases in as few round trips as the backend
	// can. The result has one error per request, in order: nil when renewed,
	// ErrNotHeld when the lease is gone (authoritative: it will never be
	// renewed again; ErrTakenOver when the backend can tell that another
	// lease holds the name), anything else when the outcome is unknown.
	// The caller uses reqs again once Renew returns: Renew keeps neither
	// it nor pointers into it.
	Renew(ctx context.Context, reqs []RenewRequest) []error
	// Release ends a lease. ErrNotHeld when that lease id does not hold it.
	// A backend that can block bounds a release whose ctx has no
	// deadline, cheaply: the agent's releases outlive the requests that
	// ask for them, and it sets no deadline of its own on the hot path.
	Release(ctx context.Context, l LeaseKey) error
	// Inspect reports the live holders of a name and its last token.
	Inspect(ctx context.Context, name string) (LockInfo, error)
	// Leave takes a ticket out of the name's queue, waking the waiters
	// that may ask now. Leaving a ticket that is not queued is not an
	// error.
	Leave(ctx context.Context, name, ticket string) error
	// Watch returns a channel that receives a value (coalesced) whenever
	// name may have become free for the waiter of ticket (a release, or
	// the ticket reaching the head of the queue), and a function that ends
	// the watch. Only the waiters that may ask are woken, not every waiter
	// of the name. With ticket "" it receives every such notification of
	// the name. The watch is in place when Watch returns, so a release
	// after it is never missed. Notifications can still be lost on some
	// backends: callers also retry after HeldError.RetryIn.
	Watch(ctx context.Context, name, ticket string) (<-chan struct{}, func(), error)
	// Close releases the backend's resources. Operations after Close return
	// ErrClosed.
	Close() error
}

// Local is a Backend that may say its calls are function calls in the
// agent's own process (the embedded backend): the agent then releases a
// lease before it answers, rather than owe the release to the next
// attempt of the name, which saves a backend that crosses a network a
// round trip but costs the agent a timer.
type Local interface {
	Local() bool
}

// Parted is a Backend whose names live on independent servers (Redis
// Cluster: the primary of each hash slot). Part names the server of a
// name, "" when there is only one. The agent sends the renewals of each
// part as a batch of its own, so that a server that hangs delays only
// its own leases' answers: one batch's answers are applied together, and
// a lease already close to its deadline would otherwise wait for them.
type Parted interface {
	Part(name string) string
}
